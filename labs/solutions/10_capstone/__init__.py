"""A small mixture-of-experts language model over Python's own help text: `data` (corpus, tokenizer,
batches), `model`, `train` and `serve`. The modules import each other relatively: load the folder as a
package (the lab's guide does it with `helpers.capstone.load_project`)."""
