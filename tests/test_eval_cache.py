"""The starting model's evaluation cache: keys change with everything the result depends on."""

from __future__ import annotations

from mixrl.config.compose import compose_config
from mixrl.evaluation import cache as eval_cache

ROWS = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "2+2=", "answer": "4"}]


def test_key_depends_on_model_rows_seed_and_settings(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 10)
    base = compose_config([])
    k = eval_cache.cache_key(base, str(model), ROWS)
    assert k == eval_cache.cache_key(compose_config([]), str(model), [dict(r) for r in ROWS])  # deterministic
    # a different recipe with the same evaluation shares the key (that is the point)
    assert k == eval_cache.cache_key(compose_config(["algo=luffy"]), str(model), ROWS)
    for other in (["seed=1"], ["trainer.eval_samples=8"], ["trainer.max_completion_length=16"],
                  ["trainer.temperature=0.7"], ["trainer.eval_batch_size=64"]):
        assert eval_cache.cache_key(compose_config(other), str(model), ROWS) != k, other
    assert eval_cache.cache_key(base, str(model), ROWS[:1]) != k
    (model / "model.safetensors").write_bytes(b"y" * 11)  # other weights
    assert eval_cache.cache_key(base, str(model), ROWS) != k


def test_store_and_load(tmp_path):
    assert eval_cache.load(tmp_path, "abc") is None
    eval_cache.store(tmp_path / "c", "abc", {"accuracy": 0.25, "n": 2.0})
    assert eval_cache.load(tmp_path / "c", "abc") == {"accuracy": 0.25, "n": 2.0}
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["abc.json"]  # no temporary file left
