"""The contracts between the packages, defined once: the bottom layer every package may import.

numpy only (Pillow for the episode's first-frame image, lazily); imports none of lingbot_isaac,
bridge, worldgen, comparison or lingbot_cli. One module per contract:

- `model_frame`: the 480x832 frame LingBot-World's intrinsics are expressed in; "H*W" sizes.
- `episode`: the episode/action folder format: one reader, one writer, one validator.
- `settings`: `GenerationSettings` (one table of fields, defaults, ranges) and the presets.
- `engine_options`: `EngineOptions`, how a worker's engine is loaded, as data (JSON).
- `atomic`: the one atomic-write helper (temp file, fsync, rename, fsync the folder).
- `toml_file`: the one reader of the TOML config files (a missing or malformed file named).
"""
