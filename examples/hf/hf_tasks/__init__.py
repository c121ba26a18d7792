"""Tasks built from Hugging Face models that no one here wrote: GPT-2 and ResNet, from their configs
with random initialisation (nothing is downloaded), trained through vgame's public task API."""
