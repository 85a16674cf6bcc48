"""`convlab run --save DIR`: a timed run's record on disk, read back by `results show`, on the
CPU variant so that it runs everywhere."""

import json

import pytest
from click.testing import CliRunner

from convlab.bench import saved_runs
from convlab.cli import main
from convlab.errors import DataError

RUN = ["run", "--kernel", "cpu", "--batch", "10,20", "--repeat", "1"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "h100"
    out = CliRunner().invoke(main, [*RUN, "--save", str(folder)])
    assert out.exit_code == 0, out.output
    (json_path,) = folder.glob("*.json")
    return out, json_path


def test_a_saved_run_keeps_every_batch_and_names_itself(saved):
    out, json_path = saved
    assert json_path.name.startswith("run-ece408-cpu-b10-20-")
    assert json_path.with_suffix(".md").is_file()
    record = json.loads(json_path.read_text())
    assert record["kind"] == "run" and record["command"].startswith("convlab ")
    assert [r["batch"] for r in record["runs"]] == [10, 20]
    first = record["runs"][0]
    assert first["passed"] and [layer["name"] for layer in first["layers"]] == ["conv1", "conv2"]
    assert first["images_per_s"] == pytest.approx(10 / (first["forward_ms"] / 1e3))
    assert "saved " in out.output and json_path.name[:20] in out.output


def test_results_show_reads_a_saved_run_and_its_markdown_twin(saved):
    _, json_path = saved
    table = CliRunner().invoke(main, ["results", "show", str(json_path.with_suffix(".md"))])
    assert table.exit_code == 0, table.output
    assert "ms per forward pass by batch" in table.output
    markdown = CliRunner().invoke(main, ["results", "show", "--markdown", str(json_path)])
    assert markdown.exit_code == 0, markdown.output
    assert markdown.output.startswith("# convlab run: ece408, kernel 'cpu'")
    assert "## ece408, kernel 'cpu' (fp32), batch 20" in markdown.output
    assert "| conv2 | 12x21x21->24x15x15 7x7 | cpu |" in markdown.output
    assert markdown.output == json_path.with_suffix(".md").read_text() + "\n"
    ladder = CliRunner().invoke(main, ["results", "show", "--ladder", str(json_path)])
    assert ladder.exit_code == 1
    assert "Error: --ladder summarises compare records; this is a timed run" in ladder.output


def test_a_run_record_that_is_cut_short_is_refused_by_name(saved, tmp_path):
    _, json_path = saved
    record = json.loads(json_path.read_text())
    del record["runs"][0]["layers"][0]["timing"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(record))
    with pytest.raises(DataError, match="broken.json: malformed run record"):
        saved_runs.load_record(broken)
    out = CliRunner().invoke(main, ["results", "show", str(broken)])
    assert out.exit_code == 1 and out.output.count("\n") == 1


@pytest.mark.parametrize("extra, message", [
    (["--save", "afile"], "'afile' is a file"),
    (["--save", "afile/sub"], "afile/sub: cannot be a folder here (afile is a file)"),
    (["--save", "out", "--sanitize"], "--sanitize makes one checked launch per layer and times "
                                      "nothing: leave out --repeat, --save"),
])
def test_save_where_nothing_can_be_kept_is_one_line_before_the_run(extra, message, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    out = CliRunner().invoke(main, [*RUN, *extra])
    assert out.exit_code == 1, out.output
    assert message in out.output and out.output.count("\n") == 1
    assert "Op Time" not in out.output


def test_two_records_of_a_dotted_kernel_name_in_one_second_keep_both(tmp_path):
    """with_suffix cut "my.v2" at its dot, so the second record's "-2" name was the first's
    file again, and the search for a free name never ended."""
    from convlab.bench import results as results_io

    record = {"runs": [{"model": "ece408", "kernel": "my.v2/x", "batch": 10}],
              "timestamp": "2026-11-28T05:00:00+0000"}
    first = saved_runs.save(record, tmp_path, "# one\n")
    second = saved_runs.save(record, tmp_path, "# two\n")
    assert first[0].name == "run-ece408-my.v2_x-b10-20261128T050000.json"
    assert second[0].name == "run-ece408-my.v2_x-b10-20261128T050000-2.json"
    assert second[1].read_text() == "# two\n" and first[1].read_text() == "# one\n"
    assert results_io.save({}, tmp_path, "# x\n", "a.b")[0].name == "a.b.json"


def test_a_run_interrupted_after_a_batch_keeps_the_batches_that_ended(tmp_path, monkeypatch):
    """Ctrl-C (or a time limit's SIGINT) during the second batch: the first is shown and
    saved, with a note naming the batch that did not end, and the exit code is 130."""
    from convlab.bench import lab

    run, calls = lab.run, []

    def interrupted_second(*args, **kwargs):
        calls.append(args[0].batch)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return run(*args, **kwargs)

    monkeypatch.setattr(lab, "run", interrupted_second)
    out = CliRunner().invoke(main, [*RUN, "--save", str(tmp_path)])
    assert out.exit_code == 130, out.output
    assert "interrupted before batch 20: the batches above ended and are shown and saved" in (
        " ".join(out.output.split()))
    (json_path,) = tmp_path.glob("*.json")
    record = json.loads(json_path.read_text())
    assert [r["batch"] for r in record["runs"]] == [10] and record["runs"][0]["passed"]
    assert "the run was interrupted before batch 20" in record["runs"][0]["notes"]


def test_a_run_interrupted_in_its_first_batch_saves_nothing(tmp_path, monkeypatch):
    from convlab.bench import lab

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lab, "run", interrupted)
    out = CliRunner().invoke(main, [*RUN, "--save", str(tmp_path)])
    assert out.exit_code != 0 and "Aborted" in out.output
    assert not list(tmp_path.iterdir())
