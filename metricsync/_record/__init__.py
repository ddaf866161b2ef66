"""Recording: values checked and buffered per name (host numbers, arrays, device
tensors), folded into the state table; checkpoints that resume exactly."""
