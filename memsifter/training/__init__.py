"""Training the proxy: RL data and curriculum, cold-start SFT, GRPO with dynamic sampling,
checkpoint averaging, and the epoch loop that ties them together."""
