"""rtserver's code sampler against upstream's sampling distribution
(tests/parity/sampler_harness.py): 10,000 draws per setting, every draw in
upstream's support, chi-square p >= 1e-4. The second test is the harness's
power: the same sampler run with one setting wrong (temperature, top-p,
top-k, repetition penalty, min_new) must be rejected
against the right setting's distribution, so a sampler that drifts in any of
them fails the first test.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from .sampler_harness import Sampler, Settings, case, run, today_sample_codes

# Every sampler under test, by name: an adapter (sampler_harness.Sampler) each.
# The on-device batched sampler joins here when the engine rewrite merges.
SAMPLERS: dict[str, Sampler] = {"sample_codes": today_sample_codes}

SETTINGS = {
    # upstream's InferCodeParams defaults
    "default": Settings(scale=0.7),
    # top-k binding (top-p off)
    "top_k": Settings(temperature=1.0, top_p=1.0, top_k=20, penalty=1.0),
    # top-p binding (top-k off)
    "top_p": Settings(temperature=1.0, top_p=0.7, top_k=0, penalty=1.0),
    # the penalty and the temperature with nothing cut
    "penalty": Settings(temperature=0.7, top_p=1.0, top_k=0, penalty=1.3),
    # top-p and top-k below upstream's min_tokens_to_keep=3: three ids stay
    "keep3_p": Settings(temperature=1.0, top_p=0.05, top_k=0, penalty=1.0, scale=3.0),
    "keep3_k": Settings(temperature=1.0, top_p=1.0, top_k=1, penalty=1.0, scale=1.0),
    # EOS masked: step 2 of min_new 4
    "min_new": Settings(temperature=1.0, top_p=1.0, top_k=0, penalty=1.0, step=2, min_new=4),
}


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampler_draws_follow_upstreams_distribution(name: str, sampler: str) -> None:
    logits, history = case(seed=len(name), scale=SETTINGS[name].scale)
    if name == "min_new":  # make EOS likely, so masking it matters
        logits[625] = logits.max() + 1.0
    res = run(SAMPLERS[sampler], logits, history, SETTINGS[name])
    print(f"\n{sampler} {name}: chi2 {res.chi2:.1f} dof {res.dof} p {res.p_value:.3g} "
          f"outside support {res.outside_support}")
    assert not res.rejected, res


WRONG = [
    ("default", {"temperature": 0.33}),
    ("default", {"top_k": 15}),
    ("default", {"penalty": 1.15}),
    ("top_k", {"top_k": 17}),
    ("top_p", {"top_p": 0.65}),
    ("penalty", {"penalty": 1.2}),
    ("penalty", {"temperature": 0.77}),
    ("min_new", {"min_new": 0}),
    ("keep3_p", {"top_p": 0.95}),
    ("keep3_k", {"top_k": 4}),
]


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize(("name", "change"), WRONG,
                         ids=[f"{n}-{next(iter(c))}" for n, c in WRONG])
def test_harness_rejects_a_wrong_setting(name: str, change: dict[str, float],
                                         sampler: str) -> None:
    right = SETTINGS[name]
    logits, history = case(seed=len(name), scale=right.scale)
    if name == "min_new":
        logits[625] = logits.max() + 1.0
    res = run(SAMPLERS[sampler], logits, history, replace(right, **change), reference=right)
    print(f"\nwrong {name} {change}: chi2 {res.chi2:.1f} dof {res.dof} p {res.p_value:.3g} "
          f"outside support {res.outside_support}")
    assert res.rejected, res
