"""The app's "Send as a chat message" switch (paper E.3: instruct checkpoints are prompted through their chat
template): shown only for a model whose tokenizer has a template, applied to the prompt by every request,
refused with a message for a model without one."""

import pytest
from gradio_client import Client
from helpers import serve, tiny_llama
from test_tasks import TEMPLATE


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A tiny dual-mode model whose tokenizer carries a chat template."""
    folder = tmp_path_factory.mktemp("chat-model")
    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    model.model.config.mask_token_id = 1
    model.tokenizer.chat_template = TEMPLATE
    model.model.float().save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def url(chat_model_dir, tiny_model_dir):
    import app

    yield from serve(app.build_demo(str(chat_model_dir), allowed_models=[str(tiny_model_dir)], new_tokens_cap=16))


def chat_box(client: Client) -> dict:
    return next(c for c in client.config["components"] if c.get("props", {}).get("elem_id") == "chat")


def test_the_switch_is_shown_for_a_model_with_a_template_only(chat_model_dir, tiny_model_dir, url):
    from serve.models import ModelStore

    store = ModelStore(default=str(chat_model_dir), allowed=[str(tiny_model_dir)], device="cpu")
    assert store.chat_template(None) and not store.chat_template(store.offered[1])  # before loading either
    assert chat_box(Client(url, verbose=False))["props"]["visible"] is True


def test_a_chat_message_is_the_prompt_inside_the_template(url):
    client = Client(url, verbose=False)
    plain = client.predict("w3 w4", max_new_tokens=4, api_name="/generate")
    chat = client.predict("w3 w4", max_new_tokens=4, chat=True, api_name="/generate")
    # "<|user|> w3 w4 <|end|> <|assistant|> <think></think>": each marker is one (unknown) word of this tokenizer
    assert (plain["prompt_len"], chat["prompt_len"]) == (2, 6)


def test_chat_asked_of_a_model_without_a_template_is_refused_in_one_line(url, tiny_model_dir):
    client = Client(url, verbose=False)
    offered = next(c for c in client.config["components"] if c.get("props", {}).get("elem_id") == "model-box")
    other = offered["props"]["choices"][1][0]
    with pytest.raises(Exception, match="no chat template"):
        client.predict("w3 w4", max_new_tokens=4, chat=True, model=other, api_name="/generate")
