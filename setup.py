from setuptools import find_packages, setup

setup(
    name="hyperparallel",
    version="0.1.0",
    description="MindSpore-native parallel training: Mpipe schedule algebra and transpose for MLLM training",
    packages=find_packages(include=["hyperparallel", "hyperparallel.*"]),
    python_requires=">=3.9",
    install_requires=["numpy<2", "pyyaml"],
    extras_require={
        "mindspore": ["mindspore==2.9.0"],
        "draw": ["matplotlib"],
        "test": ["pytest", "hypothesis", "matplotlib"],
    },
    entry_points={"console_scripts": ["hyperparallel=hyperparallel.cli:main"]},
)
