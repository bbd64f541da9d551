"""Model definitions: the DiT (with its camera layers and caches), umT5, the video VAE, the tokenizer, config.json reading."""
