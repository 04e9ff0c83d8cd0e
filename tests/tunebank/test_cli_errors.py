"""Every bad input or setting ends in one line on stderr and exit 2, naming what to fix; model text never reaches the
terminal as markup or control sequences; JSON out is strict; exit codes tell the truth."""

import json
import math
import os
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

import tunebank.cli.tune as tune_cli
from transforms.tune import TuneResult, TuneResults
from tunebank.cli import app

runner = CliRunner()


def _model(path: Path, name: str = "g", node_name: str = "", tensor: str = "h") -> str:
    x, y = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]), helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [4, 8])
    nodes = [helper.make_node(node_name or "Mystery", ["x"], [tensor], domain="evil", name=node_name),
             helper.make_node("Relu", [tensor], ["y"], name=node_name)]
    graph = helper.make_graph(nodes, name, [x], [y], value_info=[helper.make_tensor_value_info(
        tensor, TensorProto.FLOAT, [4, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("evil", 1)]),
              path)
    return str(path)


def _one_line_exit_2(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


SETTINGS = {
    "TUNEBANK_MAX_MODEL_BYTES=abc": ({"TUNEBANK_MAX_MODEL_BYTES": "abc"}, "TUNEBANK_MAX_MODEL_BYTES='abc'"),
    "TUNEBANK_MAX_NODES=0": ({"TUNEBANK_MAX_NODES": "0"}, "TUNEBANK_MAX_NODES='0'"),
    "TUNEBANK_DATA_DIR empty": ({"TUNEBANK_DATA_DIR": ""}, "TUNEBANK_DATA_DIR='': is empty"),
}


@pytest.mark.parametrize("case", sorted(SETTINGS))
@pytest.mark.parametrize("command", [["inspect", "zoo:gpt_decoder-h64-s16-b1"], ["db", "stats"],
                                     ["tune", "zoo:gpt_decoder-h64-s16-b1", "--backend", "cpu"]])
def test_a_bad_setting_is_one_line_naming_it(case: str, command: list[str]) -> None:
    env, needle = SETTINGS[case]
    _one_line_exit_2(runner.invoke(app, command, env=env), needle)


def _not_sqlite(tmp: Path) -> str:
    (tmp / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    return f"sqlite:///{tmp / 'passwd'}"


DATABASES = {
    "unparseable": (lambda t: "foo", "could not parse"),
    "unknown backend": (lambda t: "mysql://a@b/c", "unsupported database backend 'mysql'"),
    "unreachable postgres": (lambda t: "postgresql://u:secret@127.0.0.1:1/db", "connection"),
    "not an sqlite file": (_not_sqlite, "is not an SQLite database"),
    "a folder": (lambda t: f"sqlite:///{t}", "is not a regular file"),
}


@pytest.mark.parametrize("case", sorted(DATABASES))
def test_bad_database_urls_are_one_line_naming_the_setting(tmp_path: Path, case: str) -> None:
    make, needle = DATABASES[case]
    url = make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    for command in (["db", "stats"], ["tune", "zoo:gpt_decoder-h64-s16-b1", "--strategy", "transfer", "--backend",
                                      "cpu"]):
        result = runner.invoke(app, command, env={"TUNEBANK_DATABASE_URL": url,
                                                  "TUNEBANK_DATA_DIR": str(tmp_path / "data")})
        _one_line_exit_2(result, "TUNEBANK_DATABASE_URL=")
        assert needle.lower() in result.stderr.lower() and "secret" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == before  # nothing written beside it


def test_db_stats_never_creates_a_database(tmp_path: Path) -> None:
    result = runner.invoke(app, ["db", "stats"], env={"TUNEBANK_DATA_DIR": str(tmp_path / "data")})
    _one_line_exit_2(result, "TUNEBANK_DATA_DIR=", "tunebank db upgrade")
    assert not (tmp_path / "data").exists()


def test_db_stats_json(tmp_path: Path) -> None:
    env = {"TUNEBANK_DATA_DIR": str(tmp_path)}
    assert runner.invoke(app, ["db", "upgrade"], env=env).exit_code == 0
    result = runner.invoke(app, ["db", "stats", "--json"], env=env)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["tables"]["measurements"] == 0 and stats["devices"] == [] and stats["kinds"] == []


@pytest.mark.parametrize("kind", ["a file", "under a file", "unwritable"])
def test_an_unusable_data_dir_is_one_line_before_tuning(tmp_path: Path, kind: str) -> None:
    (tmp_path / "file").write_text("x")
    data = {"a file": tmp_path / "file", "under a file": tmp_path / "file" / "sub", "unwritable": tmp_path / "ro"}[kind]
    if kind == "unwritable":
        data.mkdir(mode=0o500)
        if os.access(data, os.W_OK):
            pytest.skip("running as root: permissions do not stop writes")
    result = runner.invoke(app, ["tune", "zoo:gpt_decoder-h64-s16-b1", "--backend", "cpu", "--budget", "1"],
                           env={"TUNEBANK_DATA_DIR": str(data)})
    _one_line_exit_2(result, "TUNEBANK_DATA_DIR=")


@pytest.mark.parametrize("command", ["inspect", "tune"])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_non_regular_model_paths_are_refused_before_opening(tmp_path: Path, command: str, kind: str) -> None:
    for suffix in (".onnx", ".json"):
        path = tmp_path / f"model{suffix}"
        os.mkfifo(path) if kind == "fifo" else path.mkdir()  # a FIFO would block an open() forever
        result = runner.invoke(app, [command, str(path), "--backend", "cpu"][:2 if command == "inspect" else 4],
                               env={"TUNEBANK_DATA_DIR": str(tmp_path / "data")})
        _one_line_exit_2(result, "is not a regular file")


def test_model_files_over_the_limit_are_refused_for_every_command(tmp_path: Path) -> None:
    onnx_path, json_path = _model(tmp_path / "m.onnx"), tmp_path / "g.json"
    json_path.write_text("{}" + " " * 2000)
    for command in (["inspect"], ["tune", "--backend", "cpu"]):
        for path in (onnx_path, str(json_path)):
            result = runner.invoke(app, [command[0], path, *command[1:]], env={"TUNEBANK_MAX_MODEL_BYTES": "100"})
            _one_line_exit_2(result, "over the limit of 100 bytes (TUNEBANK_MAX_MODEL_BYTES)")


HOSTILE_NAMES = ["[/x]", "[bold red]boom[/]", "\x1b[2J\x1b[H", "\x1b]0;pwned\x07", "a\u202eb"]


@pytest.mark.parametrize("text", HOSTILE_NAMES, ids=lambda t: t.encode("unicode_escape").decode())
def test_names_in_models_are_printed_as_text_never_markup_or_escapes(tmp_path: Path, text: str) -> None:
    path = _model(tmp_path / "m.onnx", name=text, node_name=text, tensor=text)
    result = runner.invoke(app, ["inspect", path], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output and "\u202e" not in result.output
    if text.startswith("["):
        assert text in result.output  # shown literally, not interpreted
    else:
        assert text.encode("unicode_escape").decode().replace("\\\\", "\\")[:4] in result.output


def test_tune_json_is_strict_and_exit_1_when_nothing_was_measured(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    failed = TuneResult("m#0 (relu)", "pointwise", 10, 1e-5, "parallel(1)", math.inf, None, math.inf, 3, 3)
    monkeypatch.setattr(tune_cli, "tune", lambda *a, **k: TuneResults([failed]))
    args = ["tune", "zoo:gpt_decoder-h64-s16-b1", "--backend", "cpu", "--budget", "2"]
    result = runner.invoke(app, [*args, "--json"], env={"TUNEBANK_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 1
    rows = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert rows[0]["best_s"] is None and rows[0]["default_s"] is None
    assert result.stderr.strip().startswith("error: nothing could be measured") and len(result.stderr.splitlines()) == 1
    table = runner.invoke(app, args, env={"TUNEBANK_DATA_DIR": str(tmp_path)})
    assert table.exit_code == 1 and "nothing could be measured" in table.stderr


def test_inspect_json_round_trips_into_tune_and_inspect(tmp_path: Path) -> None:
    out = tmp_path / "ir.json"
    assert runner.invoke(app, ["inspect", "gpt_decoder-h64-s16-b1", "--json", str(out)]).exit_code == 0
    again = runner.invoke(app, ["inspect", str(out)])
    assert again.exit_code == 0, again.output
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(json.loads(out.read_text())["subgraphs"][0]["graph"]))
    tuned = runner.invoke(app, ["tune", str(graph), "--backend", "cpu", "--budget", "1", "--json"],
                          env={"TUNEBANK_DATA_DIR": str(tmp_path / "data")})
    assert tuned.exit_code == 0, tuned.output
    assert len(json.loads(tuned.stdout)) == 1
    whole = runner.invoke(app, ["tune", str(out), "--backend", "cpu", "--budget", "1", "--json"],
                          env={"TUNEBANK_DATA_DIR": str(tmp_path / "data"), "TUNEBANK_MAX_KERNEL_NODES": "1"})
    _one_line_exit_2(whole, "TUNEBANK_MAX_KERNEL_NODES")  # the whole model was read from the inspect document


def test_tune_refuses_a_problem_over_the_memory_limit_before_allocating(tmp_path: Path) -> None:
    path = tmp_path / "big.onnx"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [32768, 32768])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32768, 32768])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert runner.invoke(app, ["inspect", str(path)]).exit_code == 0  # legal, and nothing allocated
    result = runner.invoke(app, ["tune", str(path), "--backend", "cpu"], env={"TUNEBANK_DATA_DIR": str(tmp_path)})
    _one_line_exit_2(result, "TUNEBANK_MAX_PROBLEM_BYTES")
    small = runner.invoke(app, ["inspect", str(path)], env={"TUNEBANK_MAX_TENSOR_ELEMENTS": "1000"})
    _one_line_exit_2(small, "TUNEBANK_MAX_TENSOR_ELEMENTS")


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("tunebank ")


def test_version_from_a_source_tree_that_was_never_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == "tunebank (source tree, not installed)\n"


def test_embed_train_lists_known_devices_for_an_unknown_one(tmp_path: Path) -> None:
    env = {"TUNEBANK_DATA_DIR": str(tmp_path)}
    assert runner.invoke(app, ["db", "upgrade"], env=env).exit_code == 0
    result = runner.invoke(app, ["embed", "train", "--device", "cpu"], env=env)
    _one_line_exit_2(result, "unknown device 'cpu'; known devices: none")


def test_embed_promote_refuses_names_that_are_paths(tmp_path: Path) -> None:
    result = runner.invoke(app, ["embed", "promote", "learned", "../../etc"], env={"TUNEBANK_DATA_DIR": str(tmp_path)})
    _one_line_exit_2(result, "is not a valid name")


@pytest.mark.parametrize("document", ["[" * 100_000, '{"measurements": []}', "[1, 2]", '{"measurements": {"a": 1}}'])
def test_bench_replay_of_broken_json_is_one_line(tmp_path: Path, document: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(document)
    result = runner.invoke(app, ["bench", "transfer", "--replay", str(path), "--out", str(tmp_path / "o")])
    _one_line_exit_2(result, "cannot read a recording")


def test_tables_fit_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    import tunebank.cli.inspect as inspect_cli

    monkeypatch.setattr(inspect_cli, "console", Console(width=80, file=open(tmp_path / "out", "w")))  # noqa: SIM115
    assert runner.invoke(app, ["inspect", "gpt_decoder-h64-s16-b1"]).exit_code == 0
    inspect_cli.console.file.close()
    lines = (tmp_path / "out").read_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any("matmul" in line for line in lines)  # the ops column is wide enough to read


def test_tune_passes_timeout_and_cpu_threads_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_tune(*args, **kwargs):
        seen.update(kwargs, threads=os.environ.get("OMP_NUM_THREADS"))
        return TuneResults([TuneResult("m#0 (relu)", "pointwise", 10, 1e-5, "parallel(1)", 2e-5, "parallel(1)", 1e-5,
                                       3, 0)])

    monkeypatch.setattr(tune_cli, "tune", fake_tune)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = runner.invoke(app, ["tune", "zoo:gpt_decoder-h64-s16-b1", "--backend", "cpu", "--timeout", "2.5",
                                 "--cpu-threads", "3"], env={"TUNEBANK_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert seen["timeout_s"] == 2.5 and seen["threads"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_a_busy_machine_warns_after_timing_and_never_beside_an_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tensors": {"x": {"shape": [4, 8], "dtype": "float32", "role": "input"},
                                           "y": {"shape": [4, 8], "dtype": "float32"}},
                               "nodes": [{"op": "softmax", "inputs": ["x"], "outputs": ["y"], "attrs": {"axis": 5}}],
                               "inputs": ["x"], "outputs": ["y"]}))
    env = {"TUNEBANK_DATA_DIR": str(tmp_path / "data")}
    _one_line_exit_2(runner.invoke(app, ["tune", str(bad), "--backend", "cpu"], env=env), "axis 5 out of range")
    ok = TuneResults([TuneResult("m#0 (relu)", "pointwise", 10, 1e-5, "parallel(1)", 2e-5, "parallel(1)", 1e-5, 3, 0)])
    monkeypatch.setattr(tune_cli, "tune", lambda *a, **k: ok)
    timed = runner.invoke(app, ["tune", "zoo:gpt_decoder-h64-s16-b1", "--backend", "cpu"], env=env)
    assert timed.exit_code == 0 and timed.stderr.startswith("warning: the machine was busy")
    assert runner.invoke(app, ["tune", "zoo:gpt_decoder-h64-s16-b1", "--backend", "cpu", "--cpu-threads", "1"],
                         env=env).stderr == ""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
