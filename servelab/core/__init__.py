"""The lowest layer: the Food-11 contract every box uses (labels, decoding guards, preprocessing,
softmax), the kit's paths, and process plumbing. Imports nothing else of servelab."""
