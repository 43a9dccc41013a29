"""Example models for trying the tools; installed as `torch_skills.examples` (`torch-skills --demo`)."""
