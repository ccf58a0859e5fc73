"""Training pipelines that drive the library's layers from above: they train with the algorithm cores
(nitro.algos), sample with nitro.policy and plan with nitro.scaling, and nothing below imports them.

`minions_pretrain`: the MinionsRL scheduler's pre-training (`nitro pretrain-minions`)."""
