import numpy as np
import pandas as pd

from fastlm.corpus.splitting import SPLITS, assign_splits, cap_rows, text_keys


def _splits(texts, salt=""):
    keys = text_keys(texts, salt)
    return dict(zip(texts, (SPLITS[code] for code in assign_splits(keys[:, 0], 0.8, 0.1, 0.1)), strict=True))


def test_appending_rows_never_moves_an_existing_row(sample_texts):
    before = _splits(sample_texts[:300])
    after = _splits(sample_texts[:300][::-1] + sample_texts[300:])  # reordered and appended
    assert all(after[text] == split for text, split in before.items())


def test_ratios_are_respected_and_salt_redraws():
    texts = [f"text number {i}" for i in range(20_000)]
    counts = np.bincount(assign_splits(text_keys(texts)[:, 0], 0.8, 0.1, 0.1), minlength=3) / len(texts)
    assert np.allclose(counts, [0.8, 0.1, 0.1], atol=0.01)
    assert _splits(texts[:2000]) != _splits(texts[:2000], salt="other")


def test_zero_ratio_gets_no_rows_even_at_the_boundary():
    keys = np.array([0.0, 0.5, 0.8999999, 0.95, 0.9999999999])
    assert set(assign_splits(keys, 0.9, 0.1, 0.0)) <= {0, 1}
    assert set(assign_splits(keys, 1.0, 0.0, 0.0)) == {0}


def test_cap_is_deterministic_and_independent_of_row_order(sample_texts):
    keys = text_keys(sample_texts)[:, 1]
    chosen = {sample_texts[i] for i in cap_rows(keys, 100)}
    reversed_texts = sample_texts[::-1]
    chosen_reversed = {reversed_texts[i] for i in cap_rows(text_keys(reversed_texts)[:, 1], 100)}
    assert len(chosen) == 100 and chosen == chosen_reversed
    assert list(cap_rows(keys, None)) == list(range(len(sample_texts)))
    positions = cap_rows(keys, 100)
    assert list(positions) == sorted(positions)  # original order kept


def test_a_text_written_with_single_spaces_keeps_its_split_and_its_variants_share_it():
    """The split key is the text with the spaces inside each line made single spaces: a text written so
    (most texts) keys on itself as before, its split unchanged; a variant (a no-break space, two spaces, a
    tab) keys on the same text and so lies in the same split."""
    from fastlm.corpus.config import parse_split_params
    from fastlm.corpus.split_steps import split_rows

    texts = [f"배송이 빨라요 {i}번째 리뷰\n둘째 줄 {i}" for i in range(200)]
    config = parse_split_params({"ratios": {"train": 0.5, "validation": 0.25, "test": 0.25}})
    splits, _, codes = split_rows(pd.DataFrame({"text": texts}), config)
    assert codes.tolist() == assign_splits(text_keys(texts)[:, 0], 0.5, 0.25, 0.25).tolist()
    variants = [text.replace(" ", "\u00a0", 1).replace(" ", "  ", 1).replace("\n", " \n\t") for text in texts]
    _, _, variant_codes = split_rows(pd.DataFrame({"text": variants}), config)
    assert variant_codes.tolist() == codes.tolist()
