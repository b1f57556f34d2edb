"""Models: the policy network itself, apart from how it is trained.

Building it (the tiny local models: :mod:`.tiny`; loading a model folder: :mod:`.loading`; LoRA:
:mod:`.lora`; 4-bit QLoRA bases: :mod:`.quantization`; FSDP2 sharding: :mod:`.fsdp`), its weights as Hugging Face ``(name, tensor)``
pairs with LoRA merged and 4-bit weights dequantised (:mod:`.weights`), and saving and reading it
(model folders: :mod:`.export`, the one dequantise-and-save path; checkpoints: :mod:`.checkpoints`; a
checkpoint as a model source, exported once: :mod:`.checkpoint_source`).

May import: ``core``. Everything above imports it.
"""
