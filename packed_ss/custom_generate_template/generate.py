"""This checkpoint's ``generate``: packed-ss's self-speculative schedules through transformers' ``custom_generate``.

Loaded with ``trust_remote_code=True`` (``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``, or
``model.generate(..., custom_generate=folder, trust_remote_code=True)``), ``model.generate(**inputs,
schedule="packed", block_size=8, max_new_tokens=64)`` decodes with packed-ss, which must be installed. Written by
``packed_ss.hf_generate.write_custom_generate``; the code is ``packed_ss.hf_generate.checkpoint_generate``.
"""

try:
    from packed_ss.hf_generate import checkpoint_generate
except ImportError as error:  # transformers names a missing module by its import name: say what to install
    raise ImportError("this checkpoint's custom_generate runs packed-ss, which is not installed: pip install "
                      "packed-ss (or pip install -e PATH_TO_A_PACKED_SS_CHECKOUT)") from error


def generate(model, **kwargs):
    """``model.generate(**kwargs)`` with packed-ss's schedules (``schedule=``, ``block_size=``...): the prompt and new
    ids as a (1, P + N) tensor, or an output with ``sequences`` and the run's figures when
    ``return_dict_in_generate=True``. Raises: ValueError for what packed-ss cannot honour."""
    return checkpoint_generate(model, **kwargs)
