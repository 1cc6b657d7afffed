"""Which model versions keep their data: the policy people state, decided without I/O."""

from __future__ import annotations

import datetime as dt

import pytest

from emr_ray.cluster.model_retention import (
    REGISTERED_MODELS_TAG,
    VersionPolicy,
    registered_models,
    versions_of_model,
    with_registered_model,
)

NOW = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
DAY_MS = 86400 * 1000


def ms(days_ago: float) -> int:
    return int((NOW.timestamp() - days_ago * 86400) * 1000)


def test_versions_are_ranked_newest_first_and_carry_their_aliases_and_named_data():
    rows = [("2", "r2", ms(9), {}), ("10", "r10", ms(1), {}),
            ("3", "r3", ms(8), {"data_uri": "file:///d/dt=1/", "generation": "g1"})]  # fmt: skip
    facts = {f.version: f for f in versions_of_model("m", rows, {"champion": "2", "challenger": "10"})}
    assert [facts[v].rank for v in ("10", "3", "2")] == [0, 1, 2]  # by number, not by text
    assert facts["2"].aliases == ("champion",) and facts["3"].aliases == ()
    assert facts["3"].generations == (("file:///d/dt=1", "g1"),)
    assert facts["10"].registered_at == dt.datetime.fromtimestamp(ms(1) / 1000, dt.UTC)


def test_an_alias_holder_keeps_its_data_however_old_and_the_rest_by_rank_or_age():
    policy = VersionPolicy(keep_newest=2, keep_days=7)
    facts = {f.version: f for f in versions_of_model(
        "m", [(str(v), f"r{v}", ms(30 - v), {}) for v in range(1, 31)], {"champion": "1"})}  # fmt: skip
    assert policy.why_kept(facts["1"], NOW) == "holds @champion"  # 29 days old, archived or not
    assert policy.why_kept(facts["30"], NOW) == "among the newest 2 versions of m"
    assert policy.why_kept(facts["25"], NOW) == "registered 5.0 days ago (kept 7 days)"
    assert policy.why_kept(facts["20"], NOW) is None


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (lambda: VersionPolicy(keep_newest=0), "keep at least the newest version"),
        (lambda: VersionPolicy(keep_days=-1), "cannot be negative"),
    ],
)
def test_a_version_policy_that_could_drop_a_version_being_promoted_is_refused(policy, message):
    with pytest.raises(ValueError, match=message):
        policy()


def test_the_run_names_each_model_once_and_an_unreadable_tag_proves_nothing():
    tags = {REGISTERED_MODELS_TAG: with_registered_model({}, "b")}
    tags[REGISTERED_MODELS_TAG] = with_registered_model(tags, "a")
    assert registered_models(tags) == ["a", "b"]
    assert with_registered_model(tags, "a") is None  # already named: no write
    assert registered_models({}) == []
    assert registered_models({REGISTERED_MODELS_TAG: "not json"}) is None
