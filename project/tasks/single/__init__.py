"""One class per image, the default task; torch-free here for ``answers.py`` and ``labels.py``."""
