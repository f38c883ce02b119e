"""Hardware/model co-design: an accelerator described in detail (`description`: matrix and vector units, memory
levels, host link, native operators) and a model's operator graph projected onto it (`graph`, `projection`)."""
