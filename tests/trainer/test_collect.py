"""collect(): how many prompts a rollout generates, per method."""

from __future__ import annotations

from trainer.loop import Trainer


def generated_per_round(make_cfg, **sections) -> tuple[list[int], dict]:
    trainer = Trainer(make_cfg("collect", **sections))
    trainer.setup(track=False)
    sizes: list[int] = []
    generate = trainer.collector.generate_round

    def recording(problems, seed):
        sizes.append(len(problems))
        return generate(problems, seed)

    trainer.collector.generate_round = recording
    return sizes, trainer.collect().stats


def test_without_dynamic_sampling_one_round_of_prompts_per_step(make_cfg):
    """GRPO keeps prompts_per_step groups from its one round: gen_prompts_per_round (the
    recipe's 3x refill pool) would generate 12 and discard 8."""
    sizes, stats = generated_per_round(make_cfg, method={"name": "GRPO"},
                                       rollout={"gen_prompts_per_round": 12})
    assert sizes == [4]
    assert stats["groups_kept"] == 4 and stats["groups_dropped"] == 0


def test_with_dynamic_sampling_rounds_of_gen_prompts_per_round(make_cfg):
    sizes, _ = generated_per_round(make_cfg, method={"name": "DAPO"},
                                   rollout={"dynamic_sampling": True, "max_gen_batches": 2,
                                            "gen_prompts_per_round": 8})
    assert sizes and set(sizes) == {8}
