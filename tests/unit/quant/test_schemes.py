import pytest

from lmiserve.rolling_batch.quant.schemes import UnsupportedQuantization, checkpoint_scheme, resolve_scheme
from lmiserve.rolling_batch.quant.writers import quantization_config


def cfg(q):
    return {"architectures": ["LlamaForCausalLM"], "quantization_config": q}


def test_plain_checkpoint_has_no_scheme():
    assert checkpoint_scheme({"architectures": ["LlamaForCausalLM"]}) is None


def test_awq_gemm():
    s = checkpoint_scheme(cfg(quantization_config("awq", 128)))
    assert (s.method, s.weights, s.bits, s.group_size, s.zero_point) == ("awq", "int4", 4, 128, True)
    assert s.describe() == "awq int4 g128 zero-point"


def test_gptq_variants():
    s = checkpoint_scheme(cfg(quantization_config("gptq", 32, act_order=True)))
    assert (s.method, s.group_size, s.zero_point, s.act_order) == ("gptq", 32, False, True)
    assert s.describe() == "gptq int4 g32 symmetric act-order"
    s = checkpoint_scheme(cfg({"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": False, "desc_act": False}))
    assert (s.strategy, s.group_size, s.zero_point) == ("channel", -1, True)
    assert s.describe() == "gptq int4 per-channel zero-point"


def test_fp8_and_compressed_tensors():
    s = checkpoint_scheme(cfg(quantization_config("fp8")))
    assert (s.method, s.weights, s.strategy, s.activations, s.ignore) == (
        "compressed-tensors",
        "fp8",
        "channel",
        "dynamic",
        ("lm_head",),
    )
    assert s.describe() == "fp8 e4m3 per-channel (compressed-tensors), dynamic per-token activations"
    s = checkpoint_scheme(cfg({"quant_method": "fp8", "activation_scheme": "static"}))
    assert (s.method, s.strategy, s.activations) == ("fp8", "tensor", "static")
    assert s.describe() == "fp8 e4m3 per-tensor (fp8), static per-tensor activations"
    s = checkpoint_scheme(cfg(quantization_config("int4", 64)))
    assert (s.method, s.weights, s.group_size, s.zero_point) == ("compressed-tensors", "int4", 64, False)
    assert s.describe() == "compressed-tensors int4 g64 symmetric"
    assert resolve_scheme(cfg(quantization_config("gptq", 128)), "none").describe().endswith(", dequantized at load")


@pytest.mark.parametrize(
    "q, named",
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "awq version 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": False}, "zero_point"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "gptq 8-bit"),
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "gptq 3-bit"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}, "gptq_v2"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "marlin"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "weight_block_size"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
        ({"quant_method": "exl2"}, "'exl2'"),
        ({"quant_method": "hqq"}, "'hqq'"),
        ({"quant_method": "aqlm"}, "'aqlm'"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "naive-quantized",
                "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int"}}},
            },
            "naive-quantized",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {
                    "g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block"}}
                },
            },
            "float-quantized float8 block",
        ),
    ],
)
def test_refusals_name_the_scheme_and_list_the_supported(q, named):
    with pytest.raises(UnsupportedQuantization) as e:
        checkpoint_scheme(cfg(q))
    assert named in str(e.value)
    assert "Supported checkpoints: awq" in str(e.value) and "compressed-tensors pack-quantized" in str(e.value)


def test_resolve_with_option_quantize():
    awq, dense = cfg(quantization_config("awq", 128)), {"architectures": ["LlamaForCausalLM"]}
    assert resolve_scheme(awq, None).method == "awq"
    assert resolve_scheme(awq, "awq").method == "awq"
    assert resolve_scheme(awq, "none").dequantize
    assert resolve_scheme(dense, None) is None and resolve_scheme(dense, "none") is None
    with pytest.raises(ValueError, match="option.quantize=gptq needs a gptq checkpoint, this one holds awq int4"):
        resolve_scheme(awq, "gptq")
    with pytest.raises(ValueError, match="needs a awq checkpoint, this one holds plain weights"):
        resolve_scheme(dense, "awq")
    with pytest.raises(ValueError, match="already quantized"):
        resolve_scheme(awq, "fp8")
    fp8 = resolve_scheme(dense, "fp8")
    assert (
        fp8.on_the_fly and fp8.describe() == "fp8 e4m3 per-channel (quantized at load), dynamic per-token activations"
    )
    assert resolve_scheme(dense, "int8").describe() == "int8 q8_0 blocks of 32 (quantized at load)"
    ct_fp8 = cfg(quantization_config("fp8"))
    assert resolve_scheme(ct_fp8, "fp8").method == "compressed-tensors"
    with pytest.raises(ValueError, match="already quantized"):
        resolve_scheme(ct_fp8, "int8")


def test_schemes_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, lmiserve.rolling_batch.quant.schemes; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
