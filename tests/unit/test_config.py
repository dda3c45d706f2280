from pathlib import Path

import pytest

from lmiserve.config import ConfigError, load_settings
from lmiserve.config.show import render


def write(dir_: Path, text: str) -> Path:
    (dir_ / "serving.properties").write_text(text)
    return dir_


def test_defaults_follow_lmi(tmp_path):
    s = load_settings(tmp_path, env={})
    assert s.server.port == 8080
    assert s.server.max_request_size == 64 * 1024 * 1024
    m = s.model
    assert (m.batch_size, m.max_batch_delay, m.max_idle_time) == (1, 100, 60)
    assert (m.min_workers, m.max_workers, m.job_queue_size) == (1, 1, 1000)
    assert (m.predict_timeout, m.model_loading_timeout) == (120, 1800)
    assert (m.rolling_batch, s.engine.max_rolling_batch_size, m.tensor_parallel_degree) == ("auto", 256, 1)
    assert m.trust_remote_code is False and m.tgi_compat is False and m.enable_streaming is False
    assert all(str(src) == "default" for src in s.sources.values())


def test_file_wins_over_env_and_cli_wins_over_both(tmp_path):
    # DJL: serving.properties wins; OPTION_* / SERVING_* apply only where the file is silent
    write(tmp_path, "option.dtype=fp16\nbatch_size=2\nport=9000\n")
    env = {"OPTION_DTYPE": "bf16", "SERVING_BATCH_SIZE": "4", "OPTION_MAX_ROLLING_BATCH_SIZE": "16"}
    s = load_settings(tmp_path, env=env, cli={"port": "9100"})
    assert s.model.dtype == "fp16"
    assert str(s.sources["option.dtype"]).startswith("file ")
    assert s.engine.max_rolling_batch_size == 16
    assert str(s.sources["option.max_rolling_batch_size"]) == "env OPTION_MAX_ROLLING_BATCH_SIZE"
    assert s.model.batch_size == 2
    assert str(s.sources["batch_size"]).startswith("file ")
    assert s.server.port == 9100
    assert str(s.sources["port"]) == "cli --port"


def test_option_and_serving_prefixes_match_djl_names(tmp_path):
    env = {
        "OPTION_ENTRYPOINT": "my_model.py",
        "OPTION_MAX_ROLLING_BATCH_SIZE": "16",
        "SERVING_JOB_QUEUE_SIZE": "7",
        "SERVING_MIN_WORKERS": "2",
        "SERVING_MAXWORKERS": "3",
        "OPTION_PREDICT_TIMEOUT": "11",
    }
    s = load_settings(tmp_path, env=env)
    assert s.model.entry_point == "my_model.py"
    assert s.engine.max_rolling_batch_size == 16
    assert s.model.job_queue_size == 7
    assert (s.model.min_workers, s.model.max_workers) == (2, 3)
    assert s.model.predict_timeout == 11


@pytest.mark.parametrize(
    "name,value,key,expected",
    [
        ("HF_MODEL_ID", "org/model", "option.model_id", "org/model"),
        ("HF_MODEL_TRUST_REMOTE_CODE", "true", "option.trust_remote_code", True),
        ("SM_NUM_GPUS", "4", "option.tensor_parallel_degree", 4),
        ("TENSOR_PARALLEL_DEGREE", "max", "option.tensor_parallel_degree", "max"),
        ("MAX_BATCH_SIZE", "64", "option.max_rolling_batch_size", 64),
        ("MAX_CONCURRENT_REQUESTS", "12", "job_queue_size", 12),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "300", "predict_timeout", 300),
        ("SAGEMAKER_STARTUP_TIMEOUT", "600", "model_loading_timeout", 600),
        ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "6", "max_request_size", 6 * 1024 * 1024),
        ("SAGEMAKER_BIND_TO_PORT", "8081", "port", 8081),
    ],
)
def test_lmi_and_sagemaker_aliases(tmp_path, name, value, key, expected):
    s = load_settings(tmp_path, env={name: value})
    assert s.value(key) == expected
    assert str(s.sources[key]) == f"env {name}"


def test_explicit_variable_beats_alias_and_file_beats_both(tmp_path):
    write(tmp_path, "option.model_id=/from/file\noption.tensor_parallel_degree=1\n")
    s = load_settings(tmp_path, env={"HF_MODEL_ID": "org/alias", "OPTION_MODEL_ID": "/explicit"})
    assert s.model.model_id == "/from/file"
    s = load_settings(tmp_path, env={"SM_NUM_GPUS": "2", "TENSOR_PARALLEL_DEGREE": "4"})
    assert s.model.tensor_parallel_degree == 1
    (tmp_path / "serving.properties").unlink()
    s = load_settings(tmp_path, env={"HF_MODEL_ID": "org/alias", "OPTION_MODEL_ID": "/explicit"})
    assert s.model.model_id == "/explicit"
    s = load_settings(tmp_path, env={"HF_MODEL_ID": "org/alias"})
    assert s.model.model_id == "org/alias"
    s = load_settings(tmp_path, env={"SM_NUM_GPUS": "2", "TENSOR_PARALLEL_DEGREE": "4"})
    assert s.model.tensor_parallel_degree == 4


def test_djl_option_prefixed_timeouts_in_file(tmp_path):
    write(tmp_path, "option.predict_timeout=30\noption.model_loading_timeout=60\n")
    s = load_settings(tmp_path, env={})
    assert (s.model.predict_timeout, s.model.model_loading_timeout) == (30, 60)


@pytest.mark.parametrize(
    "env,message",
    [
        (
            {"OPTION_DTYPE": "fp64"},
            "invalid value for option.dtype: 'fp64' (set by env OPTION_DTYPE); allowed: auto, fp32, fp16, bf16",
        ),
        (
            {"SERVING_PORT": "0"},
            "invalid value for port: '0' (set by env SERVING_PORT); allowed: an integer >= 1 and <= 65535",
        ),
        (
            {"SERVING_BATCH_SIZE": "many"},
            "invalid value for batch_size: 'many' (set by env SERVING_BATCH_SIZE); allowed: an integer >= 1",
        ),
        (
            {"OPTION_ENABLE_STREAMING": "maybe"},
            "invalid value for option.enable_streaming: 'maybe' (set by env OPTION_ENABLE_STREAMING); allowed: true or false",
        ),
        (
            {"OPTION_ROLLING_BATCH": "deepspeed"},
            "invalid value for option.rolling_batch: 'deepspeed' (set by env OPTION_ROLLING_BATCH); allowed: auto, lmi, "
            "npu, vllm, disable (trtllm and scheduler: as auto)",
        ),
        (
            {"OPTION_DEVICE": "gpu"},
            "invalid value for option.device: 'gpu' (set by env OPTION_DEVICE); allowed: auto, cpu, cuda, cuda:N, npu, npu:N",
        ),
        (
            {"OPTION_TENSOR_PARALLEL_DEGREE": "0"},
            "invalid value for option.tensor_parallel_degree: '0' (set by env OPTION_TENSOR_PARALLEL_DEGREE); allowed: an integer >= 1 or max",
        ),
        ({"SERVING_MIN_WORKERS": "3"}, "minWorkers (3) is larger than maxWorkers (1)"),
    ],
)
def test_bad_values_give_one_line_naming_key_value_and_allowed(tmp_path, env, message):
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path, env=env)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_bad_value_in_file_names_the_file(tmp_path):
    write(tmp_path, "max_batch_delay=-5\n")
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path, env={})
    assert str(err.value).startswith("invalid value for max_batch_delay: '-5' (set by file ")
    assert str(err.value).endswith("allowed: an integer >= 0")


def test_aliases_of_values_are_normalised(tmp_path):
    write(tmp_path, "engine=python\noption.dtype=bfloat16\noption.rolling_batch=lmi-dist\noption.device=CUDA:1\n")
    s = load_settings(tmp_path, env={})
    assert (s.model.engine, s.model.dtype, s.model.rolling_batch, s.model.device) == ("Python", "bf16", "lmi", "cuda:1")


@pytest.mark.parametrize("value,backend", [("trtllm", "TensorRT-LLM"), ("scheduler", "hf-accelerate")])
def test_backends_lmiserve_does_not_ship_start_as_auto_with_the_substitution_named(tmp_path, value, backend):
    write(tmp_path, f"option.rolling_batch={value}\n")
    s = load_settings(tmp_path, env={})
    assert s.model.rolling_batch == "auto"
    assert any(w.startswith(f"option.rolling_batch={value} (set by file") and backend in w for w in s.warnings)
    (tmp_path / "none").mkdir()
    s = load_settings(tmp_path / "none", env={"OPTION_ROLLING_BATCH": value.upper()})
    assert s.model.rolling_batch == "auto" and any("option.rolling_batch=" in w for w in s.warnings)


def test_unknown_keys_are_warned_with_the_nearest_name(tmp_path):
    write(tmp_path, "option.max_rolling_batch_sise=8\nbatch_sise=2\noption.my_handler_setting=x\n")
    s = load_settings(tmp_path, env={"SERVING_JOB_QUEUE_SIZ": "3"})
    text = "\n".join(s.warnings)
    assert "unknown key option.max_rolling_batch_sise" in text and "did you mean option.max_rolling_batch_size?" in text
    assert "unknown key batch_sise" in text and "did you mean batch_size?" in text
    assert "unknown environment variable SERVING_JOB_QUEUE_SIZ (did you mean job_queue_size?)" in text
    assert "my_handler_setting" not in text  # a handler's own option, passed through quietly
    props = s.handler_properties()
    assert props["my_handler_setting"] == "x"
    assert props["max_rolling_batch_sise"] == "8"


def test_handler_properties_strip_option_prefix(tmp_path):
    write(tmp_path, "option.model_id=/m\noption.entryPoint=model.py\nbatch_size=3\n")
    props = load_settings(tmp_path, env={}).handler_properties()
    assert props["model_id"] == "/m"
    assert props["entryPoint"] == "model.py"
    assert props["batch_size"] == "3"
    assert props["model_dir"] == str(tmp_path.resolve())
    assert props["tgi_compat"] == "false"


def test_config_show_lists_every_key_with_its_source(tmp_path):
    write(tmp_path, "model_name=demo\noption.dtype=fp32\n")
    out = render(load_settings(tmp_path, env={"SERVING_PORT": "9999"}))
    lines = {
        line.split()[0]: line
        for line in out.splitlines()
        if line and not line.startswith(("model '", "properties file", "KEY"))
    }
    assert lines["option.dtype"].split()[1:3] == ["fp32", "file"]
    assert lines["port"].split()[1:] == ["9999", "env", "SERVING_PORT"]
    assert lines["batch_size"].split()[1:] == ["1", "default"]
    assert lines["model_name"].split()[1] == "demo"


def test_missing_model_dir_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope", env={})


def test_config_show_names_the_file_where_it_wins_golden(tmp_path):
    from pathlib import Path as _P

    write(tmp_path, "option.dtype=fp16\nbatch_size=2\n")
    env = {"OPTION_DTYPE": "bf16", "SERVING_BATCH_SIZE": "4", "OPTION_MAX_ROLLING_BATCH_SIZE": "16"}
    out = render(load_settings(tmp_path, env=env)).replace(str(tmp_path.resolve()), "MODEL_DIR")
    keys = ("option.dtype", "batch_size", "option.max_rolling_batch_size")
    text = "".join(
        " ".join(line.split()) + "\n" for line in out.splitlines() if line.split()[:1] and line.split()[0] in keys
    )
    fixture = _P(__file__).resolve().parents[1] / "fixtures" / "protocols" / "config" / "precedence.txt"
    if not fixture.exists():
        fixture.write_text(text)
    assert text == fixture.read_text()
