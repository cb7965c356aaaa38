"""sglang's declarations as warcore sees them: the names (:mod:`.names`, pure data), sglang's
real classes asked on bare objects (:mod:`.oracle`), and the warcore plugin ``sglang``
(:mod:`.plugin`, entry point ``warcore``). Importing this imports nothing of sglang."""
