// SiLU (or any int8 -> int8 function) by a 256-entry table, W lanes, one table copy per lane.
// Address = the input byte as unsigned (x & 0xFF), as in dfvg.fpga.datapath.fixed_point.lut_apply; contents
// come from build/luts/silu.hex written by scripts/gen_luts.py from fixed_point.silu_table.
// Pipeline: registered address -> registered ROM read (2 stages, BRAM/LUTRAM friendly); II = 1.
module silu_lut #(
    parameter W        = 8,
    parameter LUT_FILE = "silu.hex"
) (
    input  wire           clk,
    input  wire           rst,
    input  wire           in_valid,
    input  wire [8*W-1:0] x,
    output reg            out_valid,
    output reg  [8*W-1:0] y
);
    reg [8*W-1:0] x1;
    reg           v1;

    always @(posedge clk) begin
        v1 <= in_valid; x1 <= x;
        out_valid <= v1;
        if (rst) begin
            v1 <= 1'b0; out_valid <= 1'b0;
        end
    end

    // one single-read-port table per lane (a BRAM or LUTRAM each after synthesis)
    genvar g;
    generate
        for (g = 0; g < W; g = g + 1) begin : lane
            reg [7:0] rom [0:255];
            initial $readmemh(LUT_FILE, rom);
            always @(posedge clk) y[8*g +: 8] <= rom[x1[8*g +: 8]];
        end
    endgenerate
endmodule
