"""``parse_store_url``: the ``kv_store`` URL, its defaults, and errors naming the field."""

from __future__ import annotations

import pytest

from hybridkv.tiers import TierError
from hybridkv.tiers.store_url import parse_store_url


def test_defaults_fill_what_is_left_out() -> None:
    url = parse_store_url("mooncake://127.0.0.1:50051")
    assert url.master == "127.0.0.1:50051"
    assert url.metadata == "http://127.0.0.1:8080/metadata"
    assert (url.segment, url.buffer, url.queue) == (1 << 30, 256 << 20, 256 << 20)
    assert (url.protocol, url.device, url.local) == ("tcp", "", "127.0.0.1")
    assert url.sweep == 5.0 and not url.optional
    assert url.finish == 1.0
    assert url.zerocopy and url.staging == 64 << 20
    assert parse_store_url("mooncake://localhost").port == 50051


def test_every_field_is_read() -> None:
    url = parse_store_url(
        "mooncake://10.0.0.5:7000?metadata=http://10.0.0.5:9000/metadata&segment=4GiB"
        "&buffer=512MiB&queue=64MiB&protocol=rdma&device=mlx5_0&local=10.0.0.7&sweep=0.5"
        "&finish=250ms&zerocopy=0&staging=8MiB"
    )
    assert url.master == "10.0.0.5:7000" and url.metadata == "http://10.0.0.5:9000/metadata"
    assert (url.segment, url.buffer, url.queue) == (4 << 30, 512 << 20, 64 << 20)
    assert (url.protocol, url.device, url.local) == ("rdma", "mlx5_0", "10.0.0.7")
    assert url.sweep == 0.5
    assert parse_store_url("mooncake://h?sweep=0").sweep == 0.0  # off
    assert parse_store_url("mooncake://h?optional=1").optional
    assert url.finish == 0.25
    assert not url.zerocopy and url.staging == 8 << 20


@pytest.mark.parametrize(("text", "seconds"), [("0", 0.0), ("2s", 2.0), ("0.5", 0.5), ("60", 60)])
def test_finish_takes_seconds_or_milliseconds(text: str, seconds: float) -> None:
    assert parse_store_url(f"mooncake://h:1?finish={text}").finish == seconds


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("redis://127.0.0.1:1", "scheme must be mooncake://"),
        ("mooncake://:50051", "HOST is missing"),
        ("mooncake://127.0.0.1:99999", "port must be a number"),
        ("mooncake://127.0.0.1:1?segmnt=1GiB", "unknown field 'segmnt'"),
        ("mooncake://127.0.0.1:1?segment=lots", "field 'segment': cannot read memory size"),
        ("mooncake://127.0.0.1:1?segment=8MiB", "field 'segment' must be at least 16MiB"),
        ("mooncake://127.0.0.1:1?queue=1XB", "field 'queue'"),
        ("mooncake://127.0.0.1:1?protocol=udp", "field 'protocol' must be 'tcp' or 'rdma'"),
        ("mooncake://127.0.0.1:1?sweep=-1", "field 'sweep' must be seconds >= 0"),
        ("mooncake://127.0.0.1:1?sweep=often", "field 'sweep' must be seconds >= 0"),
        ("mooncake://127.0.0.1:1?sweep=nan", "field 'sweep' must be seconds >= 0"),
        ("mooncake://127.0.0.1:1?optional=yes", "field 'optional' must be 0 or 1"),
        ("mooncake://127.0.0.1:1?zerocopy=on", "field 'zerocopy' must be 0 or 1"),
        ("mooncake://127.0.0.1:1?staging=lots", "field 'staging'"),
        ("mooncake://127.0.0.1:1?metadata=etcd://x", "field 'metadata' must be an http"),
        ("mooncake://127.0.0.1:1?local=a&local=b", "field 'local' is given twice"),
        ("mooncake://127.0.0.1:1/path", "give only HOST:PORT"),
        ("mooncake://127.0.0.1:1?finish=soon", "field 'finish' must be 0 to 60 seconds"),
        ("mooncake://127.0.0.1:1?finish=-1s", "field 'finish' must be 0 to 60 seconds"),
        ("mooncake://127.0.0.1:1?finish=61", "field 'finish' must be 0 to 60 seconds"),
        ("mooncake://127.0.0.1:1?finish=nan", "field 'finish' must be 0 to 60 seconds"),
        ("", "kv_store must be a URL"),
    ],
)
def test_a_bad_url_names_the_field(url: str, names: str) -> None:
    with pytest.raises(TierError, match=names):
        parse_store_url(url)
