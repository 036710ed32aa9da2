"""The feature distiller's data at GPU batch sizes: documentation prompts, the prompt mix of a
batch, and the documentation corpus read on many cores."""

import functools
import sysconfig
from pathlib import Path

from cascade.distill.features import data as feature_data
from cascade.distill.features.run import FeatureDistiller
from cascade.distill.prompts import DOC_TEMPLATES, doc_prompts


def test_doc_prompts_wrap_first_paragraphs_of_long_enough_texts():
    texts = ("short", "A first paragraph that is long enough to become a prompt: " * 3
             + "\n\nsecond paragraph", "x" * 900)
    prompts = doc_prompts(texts, seed=1, max_chars=500)
    assert len(prompts) == 2
    assert all(any(p.startswith(t.split("{}")[0]) for t in DOC_TEMPLATES) for p in prompts)
    assert not any("second paragraph" in p for p in prompts)
    assert any(p.endswith("x" * 500) and "x" * 501 not in p for p in prompts)


class _Groups:
    def __init__(self, gen_batch, groups):
        import random

        from cascade.distill.features.run import FeatureDistillConfig

        self.config = FeatureDistillConfig(target=Path("t"), out=Path("o"), gen_batch=gen_batch)
        self.prompt_groups, self.random = groups, random.Random(0)


def test_a_batch_takes_up_to_half_chat_and_splits_the_rest():
    chat, code, docs = ([[0, i] for i in range(10)], [[1, i] for i in range(100)],
                        [[2, i] for i in range(100)])
    prompts = FeatureDistiller.batch_prompts(_Groups(64, (chat, code, docs)))
    kinds = [p[0] for p in prompts]
    assert (kinds.count(0), kinds.count(1), kinds.count(2)) == (10, 27, 27)
    assert len({tuple(p) for p in prompts}) == len(prompts)  # no prompt twice in a batch
    small = FeatureDistiller.batch_prompts(_Groups(8, (chat, code, [])))
    assert [p[0] for p in small].count(0) == 4 and len(small) == 8


def test_the_corpus_reads_the_same_on_many_cores(monkeypatch):
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))[:240]
    assert len(paths) == 240
    read = functools.partial(feature_data._docstrings, min_chars=200)
    serial = list(feature_data._map_files(read, paths))
    monkeypatch.setattr(feature_data.os, "cpu_count", lambda: 4)
    parallel = list(feature_data._map_files(read, paths))
    assert parallel == serial and sum(map(len, serial)) > 50


def test_the_replay_curve_reads_a_drafter_folder(tmp_path):
    from cascade.core.features.feature_drafter import FeatureDrafterConfig
    from cascade.distill.features.data import annotate
    from cascade.distill.measure.replay import curve
    from models import feature_pair, random_prompts

    target, _, drafter_dir = feature_pair(tmp_path)
    layers = FeatureDrafterConfig.for_target(target.model.config).feature_layers
    rows = random_prompts(3, seed=1, min_len=20, max_len=30)
    sequences = annotate(target.model, rows, [5, 5, 5], layers, 8)
    points = curve(target.model, drafter_dir, sequences, range(1, 4))
    assert [k for k, _, _ in points] == [1, 2, 3]
    assert all(0 <= rate <= 1 and 1 <= length <= 1 + k for k, rate, length in points)
    assert points[0][1] > 0  # a random drafter over half the vocabulary still hits sometimes
