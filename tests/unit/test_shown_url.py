"""No URL in an error message shows what stands before an ``@``: a user and maybe a
password, even in a URL that does not parse."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.errors import ConfigError, shown_url
from scheduler.fleet.url import check_coordinator_url
from scheduler.store import check_store_url

SECRET = "hunter2-s3cret"


@pytest.mark.parametrize("url", [f"cassandra://u:{SECRET}@[::1/ks", f"sqlite:/u:{SECRET}@x.db",
                                 f"zookeepr://u:{SECRET}@h/x", f"postgres://a:{SECRET}@c/d",
                                 f"zookeeper://u:{SECRET}@h:2181/x", f"cassandra://u:{SECRET}@h/ks"])
def test_a_malformed_url_never_shows_its_password(url):
    for check in (check_store_url, check_coordinator_url):
        try:
            check(url)
        except ConfigError as exc:
            assert SECRET not in str(exc)


@pytest.mark.fuzz
@given(st.text().filter(lambda t: "://" not in t and "@" not in t),
       st.text(min_size=1).filter(lambda t: "/" not in t),
       st.text().filter(lambda t: "/" not in t and "@" not in t))
def test_shown_url_hides_everything_before_the_at(scheme, userinfo, host):
    assert shown_url(f"{scheme}://{userinfo}@{host}/x") == repr(f"{scheme}://***@{host}/x")
