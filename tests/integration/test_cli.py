"""`rayq status` and `rayq account` against a running runtime."""

import pytest
from click.testing import CliRunner

import rayq
from rayq.cli import main


def test_status_prints_queues_shards_consumers_fairness_and_flooders(client):
    client.create_queue("cli-status").send("x", tenant="acme")
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 0, result.output
    for title in ("rayq queues", "rayq shards", "rayq consumers", "rayq fairness", "rayq flooders"):
        assert title in result.output
    assert "cli-status" in result.output


def test_status_names_every_accounts_queues_unambiguously(client):
    acct = rayq.connect(account="st", key=client.create_account("st"))
    acct.create_queue("cli-status").send("mine")
    client.create_queue("cli-status")
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 0, result.output
    assert "st/cli-status" in result.output and " cli-status " in result.output


def test_account_create_and_rotate_print_working_keys(client):
    created = CliRunner().invoke(main, ["account", "create", "cli-co"])
    assert created.exit_code == 0, created.output
    key = created.stdout.splitlines()[0]
    assert rayq.connect(account="cli-co", key=key).whoami() == "cli-co"
    rotated = CliRunner().invoke(main, ["account", "rotate", "cli-co", "--slot", "1"])
    assert rotated.exit_code == 0, rotated.output
    assert rayq.connect(account="cli-co", key=rotated.stdout.strip()).whoami() == "cli-co"
    with pytest.raises(rayq.AuthError):
        rayq.connect(account="cli-co", key=key)


def test_account_quota_sets_and_clears_an_accounts_limits(client):
    client.create_account("cli-q")
    result = CliRunner().invoke(main, ["account", "quota", "cli-q", "--queues", "1",
                                       "--messages", "10"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["queues=1", "messages=10", "bytes=unlimited"]
    cleared = CliRunner().invoke(main, ["account", "quota", "cli-q"])
    assert cleared.stdout.split() == ["queues=unlimited", "messages=unlimited", "bytes=unlimited"]
