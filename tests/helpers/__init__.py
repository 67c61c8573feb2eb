"""Helpers the tests share, in one place: engines built the way the e2e tests run them
(`engine`), independent references (`reference`: HF transformers greedy; `reference_quant`:
the int8 math; `attention`: plain-PyTorch attention over a paged cache; `eplb`: placement
checks and loads), and the OpenAI server wrapper (`server`)."""
