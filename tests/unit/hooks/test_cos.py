"""COSHook without a server: URLs, the default bucket, pyarrow options and the connection form."""

from __future__ import annotations

import json

import pytest

from emr_ray.exceptions import COSError
from emr_ray.hooks.cos import COSHook
from emr_ray.provider_info import get_provider_info


@pytest.fixture
def hook(monkeypatch) -> COSHook:
    monkeypatch.setenv(
        "AIRFLOW_CONN_COS_UNIT",
        json.dumps(
            {
                "conn_type": "cos",
                "login": "AKIDx",
                "password": "k" * 12,
                "extra": {"region": "ap-beijing", "bucket": "data-1250000000", "token": "tok-abcdef"},
            }
        ),
    )
    return COSHook("cos_unit")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("cos://b-1250000000/raw/a.txt", ("b-1250000000", "raw/a.txt")),
        ("cosn://b-1250000000/x", ("b-1250000000", "x")),
        ("cos://b-1250000000", ("b-1250000000", "")),
    ],
)
def test_parse_cos_url(url, expected):
    assert COSHook.parse_cos_url(url) == expected


@pytest.mark.parametrize("url", ["s3://b/k", "cos:///k", "raw/a.txt"])
def test_parse_cos_url_rejects(url):
    with pytest.raises(COSError, match="cos://"):
        COSHook.parse_cos_url(url)


def test_resolve_relative_and_full_keys(hook):
    assert hook.resolve("raw/a") == ("data-1250000000", "raw/a")  # the connection's default bucket
    assert hook.resolve("raw/a", "other-1250000000") == ("other-1250000000", "raw/a")
    assert hook.resolve("cos://x-1250000000/k") == ("x-1250000000", "k")
    with pytest.raises(COSError, match="either a cos:// URL or a relative key"):
        hook.resolve("cos://x-1250000000/k", "y-1250000000")


def test_no_bucket_anywhere_says_where_to_set_one(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_COS_NOBUCKET",
        json.dumps({"conn_type": "cos", "extra": {"region": "ap-beijing"}}),
    )
    hook = COSHook("cos_nobucket")
    with pytest.raises(COSError, match="No bucket for key 'raw/a': pass bucket_name.*'cos_nobucket'"):
        hook.resolve("raw/a")
    with pytest.raises(
        COSError, match="No bucket: pass bucket_name or set 'bucket' in connection 'cos_nobucket'"
    ):
        hook.list_keys()


def test_real_cos_pyarrow_options(hook):
    options = hook.pyarrow_s3_options()
    assert options["endpoint_override"] == "cos.ap-beijing.myqcloud.com"
    assert options["scheme"] == "https" and options["session_token"] == "tok-abcdef"
    assert options["force_virtual_addressing"] is True


def test_delete_prefix_refuses_an_empty_prefix(hook):
    with pytest.raises(COSError, match="empty prefix would empty the whole bucket"):
        hook.delete_prefix("")


def test_connection_form_metadata():
    behaviour = COSHook.get_ui_field_behaviour()
    assert behaviour["relabeling"] == {"login": "SecretId", "password": "SecretKey"}
    (info,) = [c for c in get_provider_info()["connection-types"] if c["connection-type"] == "cos"]
    assert info["hook-class-name"] == "emr_ray.hooks.cos.COSHook"
    assert info["conn-fields"]["token"]["schema"]["format"] == "password"
