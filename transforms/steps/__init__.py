"""One module per transformation; each defines ``STEP``, its instance, registered lazily in
``transforms.transformation``."""
