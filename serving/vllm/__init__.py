"""vLLM's OpenAI server as a managed subprocess: `launcher` (`VLLMServer`, the pure
`build_vllm_command`), and `site/`, put on the subprocess's PYTHONPATH, whose `sitecustomize`
mends vLLM's CPU build at start."""
