"""Question answering with retrieved memory: the working-LLM answerer and its task scores."""
