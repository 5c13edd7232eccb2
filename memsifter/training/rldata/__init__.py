"""The RL data pipeline, one stage a module: a recipe (``recipe``: the prompt spec, the sources,
the curriculum settings) is split by conversation (``split``), rendered into prompts with their
reward columns (``build``), selected by the curriculum (``curriculum``) and written as a data
folder with its card (``folder``). ``memsifter data rl`` runs it; training reads the folder."""
