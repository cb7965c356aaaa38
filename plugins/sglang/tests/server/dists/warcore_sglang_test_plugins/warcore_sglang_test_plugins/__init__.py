"""Third-party warcore plugins for the real-server tests of warcore-sglang (one module each,
one entry point each): ``fork_late`` corrects the fork backend's prefill declaration,
``early_native`` tries to declare sglang's ``torch_native`` earlier than sglang does, and
``fork_raiser`` fails whenever it is asked about the fork backend; for the multi-rank servers,
``by_rank`` answers differently on rank 1, ``rank_raiser`` fails on rank 1 only and
``rank_one`` ends rank 1 during start-up, or makes it hang."""
