"""Settings: one environment read, every knob mapped, bad values refused (no server needed)."""

from __future__ import annotations

import dataclasses

import pytest

from workers.errors import SettingsError
from workers.settings import ENV_VARS, Settings, to_environment


def test_every_knob_has_an_environment_variable_and_round_trips() -> None:
    names = {f.name for f in dataclasses.fields(Settings)} - {"from_environment"}
    assert set(ENV_VARS) == names
    assert all(var.startswith("MNEMOS_") for var in ENV_VARS.values())
    custom = Settings(cross_encoder="/models/ce", deep_threshold=None, suppression=False, alpha=0.5, clusters_k=1)
    rebuilt = Settings.from_env(to_environment(custom))
    assert rebuilt.replace(from_environment=frozenset()) == custom


def test_defaults_follow_the_design() -> None:
    s = Settings.from_env({})
    assert (s.pool_size, s.deep_pool_size, s.alpha, s.eta, s.clusters_k, s.update_rule) == (30, 100, 0.3, 0.1, 30,
                                                                                           "rank_gap")
    assert (s.turns_stream, s.outcomes_stream, s.dead_letter_stream) == ("mnemos:turns", "mnemos:outcomes",
                                                                          "mnemos:turns:dead")
    assert s.cross_encoder is None and s.from_environment == frozenset()


@pytest.mark.parametrize("env", [{"MNEMOS_POOL_SIZE": "thirty"}, {"MNEMOS_SUPPRESSION": "maybe"},
                                 {"MNEMOS_UPDATE_RULE": "linear"}, {"MNEMOS_POOL_SIZE": "0"}])
def test_bad_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env(env)
