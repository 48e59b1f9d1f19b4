//! A GAN on 1-D data: real samples N(4, 0.5), generator and discriminator small MLPs. Each
//! iteration is a discriminator update then a generator update: two `Session::run` calls over
//! one scope. Prints the generated samples' mean and standard deviation as training goes.
//!
//!     cargo run --release --example gan_1d [-- --iterations 3000]

use kiln::demos::gan_1d::{Config, train};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--iterations" => {
                config.iterations = args.next().ok_or("--iterations needs a number")?.parse()?
            }
            "--seed" => config.seed = args.next().ok_or("--seed needs a number")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    println!("real data: mean 4.000, std 0.500");
    let start = std::time::Instant::now();
    let outcome = train(&config, |r| {
        println!(
            "iteration {:>5}  D loss {:.3}  G loss {:.3}  generated mean {:.3}  std {:.3}",
            r.iteration, r.d_loss, r.g_loss, r.mean, r.std
        );
    })?;
    let elapsed = start.elapsed();
    println!(
        "{} iterations in {:.2} s ({:.0} µs per iteration, compiled); {} programs prepared",
        config.iterations,
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / config.iterations as f64,
        outcome.session.compilations()
    );
    Ok(())
}
