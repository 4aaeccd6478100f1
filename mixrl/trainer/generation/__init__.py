"""Parts about which weights produced which rows and how they are generated: lagged weights
(``trainer.staleness``), asynchronous generation on a vLLM server, the weight sync check, each
group's prompt prefilled once (``trainer.generation=shared-prefill``), padded generation that stops
computing finished rows (``trainer.generation=compact``) and the continuous engine's
cache sized per call. No module here imports TRL or transformers."""
