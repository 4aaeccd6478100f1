"""Parts about which weights produced which rows: lagged weights (``trainer.staleness``),
asynchronous generation on a vLLM server, and the weight sync check. No module here imports TRL."""
