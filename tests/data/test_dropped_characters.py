"""Characters the tokenizer cannot encode (the built-in tiny tokenizers drop everything outside their
alphabet): one warning at setup naming them, the tokenizer and what the policy reads instead."""

from __future__ import annotations

import warnings

import pytest

from lightning_grpo.data.records import PromptFormat, unencodable_characters
from lightning_grpo.data.sources import Rows
from tests.data.test_datamodule import char_ids


def test_prompts_with_characters_outside_the_alphabet_warn_once_naming_them(make_dm, tiny_model_path):
    """``"SUM 5+3="`` trains as ``" 5+3="``: said once (train and validation rows alike), before any engine."""
    rows = [{"prompt": "SUM 5+3=", "answer": "8"}, {"prompt": "12=", "answer": "3"}]
    val = [{"prompt": "MAX 1=", "answer": "1"}]
    with pytest.warns(UserWarning, match="cannot encode") as caught:
        dm = make_dm(source=Rows(rows, val))
    (warning,) = [w for w in caught if "cannot encode" in str(w.message)]
    assert str(warning.message) == (
        f"the tokenizer {tiny_model_path} cannot encode 'M', 'S', 'U' of the prompts and answers of "
        "data.source.train: those characters are dropped ('SUM 5+3=' is read as ' 5+3='); rewrite the data in "
        "the characters it has, or use a tokenizer that has them (data.tokenizer_path; the built-in tiny:text "
        "holds all printable ASCII)"
    )
    assert dm.train_records[0]["prompt_ids"] == char_ids(" 5+3=")  # what the warning says


def test_answers_and_chat_contents_are_checked_and_clean_data_is_quiet(make_dm):
    tokenizer = make_dm(source=Rows([{"prompt": "1=", "answer": "2"}] * 2)).tokenizer
    assert unencodable_characters(tokenizer, ["4821= ok\n", "Yes!", "\t"]) == ["\t", "!", "Y"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_dm(source=Rows([{"prompt": "12=", "answer": "3"}] * 2))
    assert not [w for w in caught if "cannot encode" in str(w.message)]
    chat = [{"prompt": [{"role": "user", "content": "1="}], "answer": "Two"}] * 2
    with pytest.warns(UserWarning, match=r"cannot encode 'T' of the prompts and answers"):
        make_dm(source=Rows(chat), format=PromptFormat(use_chat_template=True))
