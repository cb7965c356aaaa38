"""Third-party warcore plugins for the real-server tests of warcore-sglang (one module each,
one entry point each): ``fork_late`` corrects the fork backend's prefill declaration,
``early_native`` tries to declare sglang's ``torch_native`` earlier than sglang does, and
``fork_raiser`` fails whenever it is asked about the fork backend."""
