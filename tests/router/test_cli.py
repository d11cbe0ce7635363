"""``rstitch train-router`` parses into RouterTrainConfig and rejects bad options with a message."""

from hf_rstitch.cli.main import build_parser, main


def test_help_lists_train_router():
    parser = build_parser()
    args = parser.parse_args(["train-router", "--steps", "3", "--lam", "1e-4", "--no-do-sample", "--out", "x"])
    assert args.steps == 3 and args.lam == 1e-4 and args.do_sample is False and args.out == "x"


def test_bad_option_is_an_error_message(capsys):
    assert main(["train-router", "--group-size", "1"]) == 2
    assert "group-size must be >= 2" in capsys.readouterr().err
