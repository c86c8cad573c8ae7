"""ggml's IQ record formats: IQ4_NL, IQ4_XS (``iq4.py``) and the grid formats IQ2_XXS, IQ2_XS,
IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (``grid.py``): portable kernels."""
