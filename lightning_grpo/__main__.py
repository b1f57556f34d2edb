from lightning_grpo.cli import main

main()
