"""PyTorch Inductor: its own Optimus passes observed step by step, and our pipeline inside torch.compile."""
