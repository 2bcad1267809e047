"""Config -> a loaded pipeline that turns text into speculative generations.

- prompts: text <-> token ids (chat template, stop tokens);
- build: the engine for a config (generator, drafter, acceptor, rng);
- load: validate, then load the backends and build the pipeline;
- pipeline: `Pipeline`, what the CLI, the server and the tools drive;
- text: committed token ids -> printable text deltas for streaming.
"""
