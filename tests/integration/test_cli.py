"""`rayq status` against a running runtime: every section is printed."""

from click.testing import CliRunner

from rayq.cli import main


def test_status_prints_queues_shards_consumers_fairness_and_flooders(client):
    client.create_queue("cli-status").send("x", tenant="acme")
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 0, result.output
    for title in ("rayq queues", "rayq shards", "rayq consumers", "rayq fairness", "rayq flooders"):
        assert title in result.output
    assert "cli-status" in result.output
