"""What the built-in plugins share, and the only place they share it (a plugin never imports
another plugin): the extra that is a plugin's worker environment (``extras``), what the CPU runs
natively (``cpu_features``), the model descriptions and the image-folder format several frameworks
use (``model_specs``, ``imagefolder``), and the TensorFlow code of tf_benchmarks and tpu_official
(``tf_common``, ``tf_training``). Nothing here imports a framework at import time."""
