"""What a layout is: facts built from loaded records, strides, cuDNN's RNN layout, contents, flat groups."""
