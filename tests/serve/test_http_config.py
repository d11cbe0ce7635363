"""``HttpConfig``: the HTTP side of ``rstitch serve`` as one object -- embedded whole in ``ServeConfig`` (its flat
names and flags kept), read whole by the app (``ServerSettings.http``) -- and the server's default tau, worked out
once and handed to the engine and to the endpoints' settings alike."""

from __future__ import annotations

import dataclasses
import pickle
import re

import pytest

from hf_rstitch.cli.args import dataclass_from_args
from hf_rstitch.cli.main import build_parser, main
from hf_rstitch.engine import EngineConfig
from hf_rstitch.serve.config import ServeConfig
from hf_rstitch.serve.http_config import HttpConfig

HTTP = {"host": "0.0.0.0", "port": 9001, "max_tokens": 7, "model_name": "a, b", "max_body_bytes": 1000,
        "stream_interval": 0.5, "stream_writes_per_s": 40.0, "header_timeout": 5.0, "body_timeout": 6.0,
        "max_connections": 12, "drain_timeout": 3.0}


def test_flat_keywords_the_embedded_object_and_the_flags_give_one_config():
    flat = ServeConfig(engine="fast", max_batch=4, **HTTP)
    whole = ServeConfig(engine=EngineConfig(kind="fast", max_batch=4), http=HttpConfig(**HTTP))
    argv = ["serve", "--engine", "fast", "--max-batch", "4"]
    for name, value in HTTP.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    flags = dataclass_from_args(ServeConfig, build_parser().parse_args(argv))
    assert flat == whole == flags
    assert flat.http == HttpConfig(**HTTP) and all(getattr(flat, k) == v for k, v in HTTP.items())  # read flat too
    assert ServeConfig(http=HttpConfig(port=1), port=2, max_queue=3).http == HttpConfig(port=2)  # flat over the object
    assert ServeConfig().http == HttpConfig()


def test_the_config_survives_a_pickle_and_a_replace_as_a_replica_receives_it():
    cfg = ServeConfig(replicas=2, **HTTP)
    assert pickle.loads(pickle.dumps(cfg)) == cfg and pickle.loads(pickle.dumps(cfg)).header_timeout == 5.0
    assert dataclasses.replace(cfg, drain_timeout=9.0).http == HttpConfig(**{**HTTP, "drain_timeout": 9.0})


def test_server_settings_hold_the_http_config_and_take_its_fields_flat():
    from hf_rstitch.serve.app import ServerSettings

    flat = ServerSettings(default_max_tokens=3, drain_timeout_s=1.0, stream_interval_s=0.5, header_timeout_s=2.0,
                          body_timeout_s=4.0, disconnect_poll_s=0.05, error_ttl_s=0.3, max_connections=9,
                          max_body_bytes=100, stream_writes_per_s=0.0, model_name="toy", max_context=64)
    http = HttpConfig(max_tokens=3, drain_timeout=1.0, stream_interval=0.5, header_timeout=2.0, body_timeout=4.0,
                      disconnect_poll=0.05, error_ttl=0.3, max_connections=9, max_body_bytes=100,
                      stream_writes_per_s=0.0)
    assert flat == ServerSettings(http=http, model_name="toy", max_context=64)
    assert flat.drain_timeout_s == 1.0 and flat.model_name == "toy" and flat.http.model_name == ""


@pytest.mark.parametrize("argv, needle", [
    (["--header-timeout", "0"], "--header-timeout must be > 0 seconds, got 0.0"),
    (["--body-timeout", "-1"], "--body-timeout must be > 0 seconds, got -1.0"),
    (["--max-body-bytes", "0"], "--max-body-bytes must be >= 1, got 0"),
    (["--max-connections", "0"], "--max-connections must be >= 1, got 0"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["--stream-interval", "-0.1"], "--stream-interval must be >= 0 (0: off), got -0.1"),
    (["--stream-writes-per-s", "-1"], "--stream-writes-per-s must be >= 0 (0: off), got -1.0"),
    (["--drain-timeout", "-1"], "--drain-timeout must be >= 0 seconds, got -1.0"),
])
def test_a_bad_http_value_names_its_flag(argv, needle, capsys):
    assert main(["serve", *argv]) == 2
    assert needle in capsys.readouterr().err
    name, value = argv[0][2:].replace("-", "_"), float(argv[1])
    with pytest.raises(ValueError, match=re.escape(needle.split(" got")[0])):
        ServeConfig(**{name: value})


def test_a_field_off_the_command_line_and_a_wrong_object_are_named():
    from hf_rstitch.serve.app import ServerSettings

    with pytest.raises(ValueError, match=r"HttpConfig.disconnect_poll must be > 0 seconds, got 0"):
        ServerSettings(disconnect_poll_s=0)
    with pytest.raises(TypeError, match="ServeConfig.http must be a HttpConfig"):
        ServeConfig(http={"port": 1})


def test_served_names_come_from_the_flag_else_the_llm_folder():
    assert HttpConfig(model_name="a, b,").served_names("x/y") == ("a", "b")
    assert HttpConfig().served_names("models/My-LLM") == ("My-LLM",)
    assert HttpConfig().served_names("") == ("rstitch-toyworld-pair",)


def _counting(monkeypatch):
    from hf_rstitch.serve import config

    calls = []

    def counted(*args):
        calls.append(args)
        return real(*args)

    real = config.default_threshold
    monkeypatch.setattr(config, "default_threshold", counted)
    return calls


@pytest.mark.parametrize("given, want", [(None, 0.0123), (0.2, 0.2)])
def test_the_default_tau_is_worked_out_once_and_reaches_engine_and_settings_alike(given, want, monkeypatch):
    """A tuned ``generation_config.stitch_threshold`` (or --threshold over it): one computation a server, the same
    tau in the request engine and in what /health reports, in one process (build_server) and in a split server's
    engine process (build_parts)."""
    from hf_rstitch.serve import config
    from tiny_models import make_pair, make_tokenizer

    llm, slm = make_pair("llama")
    llm.generation_config.stitch_threshold = 0.0123
    monkeypatch.setattr(config, "load_models", lambda cfg: (llm, slm, make_tokenizer()))
    calls = _counting(monkeypatch)
    app = config.build_server(ServeConfig(threshold=given, max_batch=2))
    assert len(calls) == 1
    assert app.state.driver.engine.threshold == app.state.settings.threshold == want
    engine, settings = config.build_parts(ServeConfig(threshold=given, max_batch=2), llm, slm)
    assert len(calls) == 2 and engine.threshold == settings.threshold == want
    assert settings.http == ServeConfig().http and settings.model_name == "rstitch-toyworld-pair"
