"""The NPU self-check script, run on the CPU against the semantic torch_npu fake."""

import json


def test_selfcheck_passes_and_reports(fake_npu, tmp_path, capsys):
    from lmiserve.npu_selfcheck import main

    report_path = tmp_path / "report.json"
    assert main(["--device", "cpu", "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["ok"] is True
    assert report["versions"]["torch_npu"].endswith("cpu-semantic-fake")
    names = [c["name"] for c in report["checks"]]
    assert "reshape_and_cache (bit-exact)" in names
    assert any(n.startswith("attention decode GQA 32/8 d128") for n in names)
    assert any(n.startswith("attention chunked prefill") for n in names)
    assert any(n.startswith("greedy fp16") for n in names) and any(n.startswith("greedy fp32") for n in names)
    assert all(c["ok"] for c in report["checks"])
    assert "checks passed" in capsys.readouterr().out


def test_selfcheck_fails_on_a_wrong_kernel(fake_npu, tmp_path, monkeypatch):
    from lmiserve.npu_selfcheck import main

    real = fake_npu.npu_rms_norm

    def off_by_a_bit(x, gamma, epsilon=1e-6):
        y, rstd = real(x, gamma, epsilon)
        return y + 0.05, rstd

    monkeypatch.setattr(fake_npu, "npu_rms_norm", off_by_a_bit)
    report_path = tmp_path / "report.json"
    assert main(["--device", "cpu", "--report", str(report_path)]) == 1
    report = json.loads(report_path.read_text())
    failed = {c["name"] for c in report["checks"] if not c["ok"]}
    assert {"rms_norm d64", "rms_norm d128"} <= failed
    assert report["ok"] is False
