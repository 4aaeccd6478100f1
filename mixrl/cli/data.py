"""``mixrl data prepare NAME``: build a paper's training data from its source, as the authors' own
script does. One preparation today: ``chord-openr1`` (:mod:`mixrl.data.prepare_chord`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mixrl.cli.console import out
from mixrl.cli.errors import user_errors
from mixrl.errors import ConfigError

data_app = typer.Typer(help="Prepare training data as a paper's authors did.", no_args_is_help=True)

#: the preparations `mixrl data prepare` knows
PREPARATIONS = ("chord-openr1",)


@data_app.command("prepare")
@user_errors
def data_prepare(
    name: str = typer.Argument(..., help="What to prepare: chord-openr1 (CHORD's 20,000 RL problems and 5,000 SFT traces from OpenR1-Math)."),
    source: str = typer.Option("open-r1/OpenR1-Math-220k", "--source", help="OpenR1-Math-220k (hub id, folder or file in its schema)."),
    out_dir: Path = typer.Option(..., "--out", help="Folder to write rl/train.jsonl, sft/train.jsonl and manifest.json into (new, or one this command wrote)."),
    tokenizer: str = typer.Option("Qwen/Qwen2.5-7B-Instruct", "--tokenizer", help="Tokenizer that measures the traces (the trained model's; the authors': Qwen2.5-7B-Instruct)."),
    sft_size: int = typer.Option(5000, "--sft-size", help="SFT problems to sample (the authors': 5000)."),
    rl_size: int = typer.Option(20000, "--rl-size", help="RL problems to sample (the authors': 20000)."),
    max_tokens: int = typer.Option(8196, "--max-tokens", help="Longest trace kept, in tokens (the authors': 8196)."),
    seed: int = typer.Option(42, "--seed", help="Seed of the draws (the authors': 42)."),
    split: str = typer.Option("train", "--split", help="Split of --source."),
    subset: Optional[str] = typer.Option("default", "--subset", help="Hub config of --source (ignored for files)."),
):
    """Prepare a paper's data; chord-openr1 filters OpenR1-Math as CHORD's authors do (Trinity-RFT
    examples/mix_chord/get_openr1_data.py): problems without CJK characters, traces verified and at most
    8196 tokens; 5,000 problems with one trace each for SFT, then 20,000 of the rest (integer answers,
    two traces or more) for RL, drawn with seed 42. Point recipe=chord/* at it with
    data.source=OUT/rl offpolicy.source.dataset=OUT/sft."""
    if name not in PREPARATIONS:
        raise ConfigError(f"unknown preparation {name!r}; choose from: {', '.join(PREPARATIONS)}")
    from mixrl.data.prepare_chord import prepare_chord_openr1  # deferred: datasets and transformers

    manifest = prepare_chord_openr1(source, out_dir, tokenizer=tokenizer, sft_size=sft_size, rl_size=rl_size,
                                    max_tokens=max_tokens, seed=seed, split=split, subset=subset)
    rows = manifest["rows"]
    out.print(f"{rows['source']} source rows, {rows['filtered']} after the filters: "
              f"{rows['sft']} SFT rows in [bold]{out_dir / 'sft'}[/], {rows['rl']} RL rows in [bold]{out_dir / 'rl'}[/]")
    out.print(f"train on it: recipe=chord/qwen2.5-7b-openr1 data.source={out_dir / 'rl'} "
              f"offpolicy.source.dataset={out_dir / 'sft'}")
