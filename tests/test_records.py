"""Run metrics say what their labels say."""

from helpers import tiny_llama

from packed_ss import DecodeConfig, generate


def test_mean_advance_excludes_the_prefill_and_is_one_for_ar():
    model = tiny_llama(vocab_size=16, seed=1, logit_scale=3.0, eos=False)
    ar = generate(model, [3, 4], DecodeConfig(max_new_tokens=6), "ar")
    assert ar.mean_acceptance_length == 1.0
    packed = generate(model, [3, 4], DecodeConfig(block_size=4, max_new_tokens=12), "packed")
    later = [r for r in packed.records[1:]]
    assert packed.mean_acceptance_length == sum(len(r.appended) for r in later) / len(later)
