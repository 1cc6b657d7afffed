"""The "unchanged for N seconds" check (``emr_ray.hooks.cos_unchanged``), on a fake clock."""

from __future__ import annotations

from emr_ray.hooks.cos_unchanged import check_unchanged, object_set_fingerprint, with_inactivity_metadata

A = {"Bucket": "b", "Key": "p/a", "Size": 1, "ETag": "e1", "LastModified": "2024-01-01T00:00:00+00:00"}
B = {"Bucket": "b", "Key": "p/b", "Size": 2, "ETag": "e2", "LastModified": "2024-01-01T00:00:10+00:00"}
KW = {"inactivity_period": 5, "min_objects": 2}


def test_any_change_restarts_the_clock():
    done, state, msg = check_unchanged([A], None, now=100, **KW)
    assert not done and "fewer than min_objects=2" in msg
    done, state, _ = check_unchanged([A, B], state, now=101, **KW)  # changed: clock restarts at 101
    assert not done and state["since"] == 101
    done, state, _ = check_unchanged([B, A], state, now=105.9, **KW)  # order does not matter
    assert not done
    done, state, msg = check_unchanged([A, B], state, now=106, **KW)
    assert done and "unchanged for 5.0s" in msg
    rewritten = dict(B, ETag="e3")
    done, state, msg = check_unchanged([A, rewritten], state, now=200, **KW)
    assert not done and "changed (2 -> 2 object(s)); clock restarted" in msg and state["since"] == 200
    done, _, _ = check_unchanged([A], state, now=300, **KW)  # a deletion is a change too
    assert not done


def test_a_first_observation_starts_the_clock_now():
    done, state, msg = check_unchanged([A, B], None, now=1000, **KW)
    assert not done and state == {"fingerprint": object_set_fingerprint([A, B]), "count": 2, "since": 1000}
    assert msg == "2 object(s) unchanged for 0.0s of 5s"
    assert check_unchanged([A], None, now=1000, inactivity_period=0)[0]


def test_without_memory_the_set_is_dated_from_its_newest_last_modified():
    # reschedule mode: 00:00:10 UTC = 1704067210
    assert check_unchanged([A, B], None, now=1704067214, seed_from_last_modified=True, **KW)[0] is False
    assert check_unchanged([A, B], None, now=1704067215, seed_from_last_modified=True, **KW)[0] is True
    undated = dict(B, LastModified=None)  # unknown age: counted from now
    assert check_unchanged([A, undated], None, now=1704067300, seed_from_last_modified=True, **KW)[0] is False
    future = dict(B, LastModified="2030-01-01T00:00:00+00:00")  # a skewed clock never dates it ahead of now
    _, state, _ = check_unchanged([A, future], None, now=1704067300, seed_from_last_modified=True, **KW)
    assert state["since"] == 1704067300


def test_the_fingerprint_covers_bucket_key_size_and_etag_only():
    assert object_set_fingerprint([A, B]) == object_set_fingerprint([B, A])
    assert object_set_fingerprint([A]) == object_set_fingerprint([dict(A, LastModified="later", Url="x")])
    for change in ({"Size": 9}, {"ETag": "other"}, {"Key": "p/c"}, {"Bucket": "c"}):
        assert object_set_fingerprint([A]) != object_set_fingerprint([dict(A, **change)])


def test_with_inactivity_metadata_adds_what_the_check_needs():
    assert with_inactivity_metadata(None) == ["Size", "ETag", "LastModified"]
    wanted = with_inactivity_metadata(["Content-Type", "ETag"])
    assert wanted == ["Content-Type", "ETag", "Size", "LastModified"]
    assert with_inactivity_metadata(["*"]) == ["*"]
