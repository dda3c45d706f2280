from lmiserve.config.properties import parse_properties


def test_separators_comments_and_whitespace():
    text = """
# a comment
! another comment
engine=Python
option.model_id : /opt/ml/model
batch_size 4
  option.dtype   =   bf16
"""
    assert parse_properties(text) == {
        "engine": "Python",
        "option.model_id": "/opt/ml/model",
        "batch_size": "4",
        "option.dtype": "bf16",
    }


def test_continuation_and_escapes():
    text = "option.stop=a\\\n    b\nkey\\=with\\:sep=v\\u00e9\\n\n"
    assert parse_properties(text) == {"option.stop": "ab", "key=with:sep": "vé\n"}


def test_last_value_wins_and_empty_value():
    assert parse_properties("a=1\na=2\nb=\n") == {"a": "2", "b": ""}


def test_embedding_architectures_detected():
    from lmiserve.serving.model_factory import is_embedding_model

    assert is_embedding_model(["BertModel"]) and is_embedding_model(["XLMRobertaModel"])
    assert not is_embedding_model(["LlamaForCausalLM"]) and not is_embedding_model([])
    assert not is_embedding_model(["BertForSequenceClassification"])
