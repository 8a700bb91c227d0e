"""The embedded server's engine: the model and its adapters (`served_model`), one worker
thread that continuously batches every request's sequences (`continuous_batching`: `BatchingEngine`,
with `scheduling`'s turn order and prefill passes, `decode_batch`'s running batch and
`sampling`'s token choice; `sequence_types`: what it takes and gives), prompt tokens and their
text offsets (`tokens`), and inference's `LLMBackend` protocol on the engine (`engine_backend`), so
MCF's own code runs inside the server."""
