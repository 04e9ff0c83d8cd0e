import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from tunebank.cli import app

runner = CliRunner()


def _onnx_file(path, op_type="Relu", domain=""):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 16])
    nodes = [
        helper.make_node(op_type, ["x"], ["y"], domain=domain),
        helper.make_node("Softmax", ["y"], ["z"], axis=-1),
    ]
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [z], value_info=[y]), opset_imports=opsets)
    onnx.save(model, path)
    return str(path)


def test_inspect_zoo_model_prints_rows_and_summary(tmp_path):
    out = tmp_path / "ir.json"
    result = runner.invoke(app, ["inspect", "zoo:gpt_decoder", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "reduction" in result.output and "contraction" in result.output
    assert "not tunable: 0" in result.output
    document = json.loads(out.read_text())
    subs = document["subgraphs"]
    assert len(subs) >= 10
    assert all(s["features"] and s["loop_program"] for s in subs)
    assert {s["kind"] for s in subs} >= {"reduction", "contraction"}


def test_inspect_onnx_reports_unknown_op_as_not_tunable(tmp_path):
    path = _onnx_file(tmp_path / "m.onnx", op_type="MysteryOp", domain="com.example")
    result = runner.invoke(app, ["inspect", path])
    assert result.exit_code == 0, result.output
    assert "not tunable: 1" in result.output
    assert "MysteryOp" in result.output


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"\x08\x07garbage" * 50), "not a valid ONNX file"),
        (lambda p: p.write_bytes(Path(_onnx_file(p)).read_bytes()[:40]), "not a valid ONNX file"),
    ],
)
def test_inspect_bad_files_end_with_one_line_and_exit_2(tmp_path, make, message):
    path = tmp_path / "bad.onnx"
    make(path)
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_inspect_missing_file_and_unknown_zoo_name_exit_2(tmp_path):
    missing = runner.invoke(app, ["inspect", str(tmp_path / "nope.onnx")])
    assert missing.exit_code == 2 and "No such file" in missing.output
    unknown = runner.invoke(app, ["inspect", "zoo:not_a_model"])
    assert unknown.exit_code == 2 and "families:" in unknown.output


def test_inspect_a_plan_shows_which_layout_ops_were_folded(tmp_path):
    from tests.transforms.test_plan_folds import block, plan_of
    from transforms.plan import save_plan

    folded = save_plan(plan_of(block(), {0: (), 2: (1,)}), tmp_path / "folded.tbplan")
    out = tmp_path / "ir.json"
    result = runner.invoke(app, ["inspect", str(folded), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "layout subgraphs folded: 1 of 1" in result.output and "#1 transpose folded into #2 load" in result.output
    assert [s["runs_as"] for s in json.loads(out.read_text())["subgraphs"]] == ["kernel", "folded into #2 load",
                                                                               "kernel +folds #1"]
    view = save_plan(plan_of(block(), {0: (), 2: ()}), tmp_path / "view.tbplan")
    result = runner.invoke(app, ["inspect", str(view)])
    assert result.exit_code == 0, result.output
    assert "layout subgraphs folded: 0 of 1" in result.output and "eager view" in result.output
