"""KServe V2 generation parameters that other servers' V2 routes apply and these do not: refused by
name, never ignored."""

import pytest

from lmiserve.errors import BadRequest
from lmiserve.formatters import kserve, kserve_generate


@pytest.mark.parametrize("key", sorted(kserve.NOT_APPLIED))
def test_parameters_other_servers_apply_and_these_routes_do_not_are_refused_by_name(key):
    with pytest.raises(BadRequest, match=f"parameters.{key}: not applied"):
        kserve.parameters({"max_tokens": 4, key: 2})
    with pytest.raises(BadRequest, match=f"parameters.{key}"):
        kserve_generate.parse_generate({"text_input": "x", "parameters": {key: 1}})


def test_the_protocols_own_parameters_and_nulls_are_not_refused():
    assert kserve.parameters({"binary_data_output": True, "n": None, "max_tokens": 3}).max_tokens == 3
